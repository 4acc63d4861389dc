package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/caarlos0/env/v11"
)

// EnvPrefix starts every environment variable Sluice reads.
const EnvPrefix = "SLUICE_"

// ErrConfig reports a configuration that cannot run; the message names the variable.
var ErrConfig = errors.New("config")

// Read fills cfg (a pointer to a struct with env, envDefault, desc and
// secret tags; embedded structs are read too) from environ — KEY=VALUE
// pairs with the SLUICE_ prefix, nil for the process environment. It
// checks only that every value parses.
func Read(environ map[string]string, cfg any) error {
	opts := env.Options{Prefix: EnvPrefix}
	if environ != nil {
		opts.Environment = environ
	}
	if err := env.ParseWithOptions(cfg, opts); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, named(cfg, err))
	}
	return nil
}

// named rewrites env's parse errors, which name a struct field, to name the
// variable instead (SLUICE_EMAIL_FROM_DOMAINS entry "x": …).
func named(cfg any, err error) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return err
	}
	vars := map[string]string{} // field name → variable
	walk(reflect.ValueOf(cfg).Elem(), func(f reflect.StructField, _ reflect.Value) {
		vars[f.Name] = EnvPrefix + f.Tag.Get("env")
	})
	out := make([]error, 0, len(agg.Errors))
	for _, e := range agg.Errors {
		var pe env.ParseError
		if errors.As(e, &pe) && vars[pe.Name] != "" {
			out = append(out, fmt.Errorf("%s %w", vars[pe.Name], pe.Err))
			continue
		}
		out = append(out, e)
	}
	return errors.Join(out...)
}

// Problems collects a configuration's errors, each naming its variable.
type Problems struct {
	errs []error
	// Scope is put between the prefix and each name Add is given: the
	// variables of a named provider (PROVIDER_BACKUP_) are read and
	// checked by the code that checks the unnamed ones.
	Scope string
}

// Add records that variable name (without the prefix) is wrong.
func (p *Problems) Add(name, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%w: %s%s%s %s", ErrConfig, EnvPrefix, p.Scope, name, fmt.Sprintf(format, args...)))
}

// Join adds q's problems to p's.
func (p *Problems) Join(q *Problems) { p.errs = append(p.errs, q.errs...) }

// Scoped returns the variables of environ (nil: the process environment)
// whose names start with SLUICE_ followed by scope, named without the
// scope: what a configuration struct read with Read sees as its own. A
// named provider's settings (SLUICE_PROVIDER_BACKUP_SMS_BASE_URL) are read
// by the code that reads the unnamed ones (SLUICE_SMS_BASE_URL).
func Scoped(environ map[string]string, scope string) map[string]string {
	if environ == nil {
		environ = map[string]string{}
		for _, kv := range os.Environ() {
			k, v, _ := strings.Cut(kv, "=")
			environ[k] = v
		}
	}
	out := map[string]string{}
	for k, v := range environ {
		if rest, ok := strings.CutPrefix(k, EnvPrefix+scope); ok && rest != "" {
			out[EnvPrefix+rest] = v
		}
	}
	return out
}

// Err is every problem joined, nil when there is none.
func (p *Problems) Err() error { return errors.Join(p.errs...) }

// Var describes one environment variable of a configuration struct.
type Var struct {
	Name, Default, Description string
	Secret                     bool
}

// Vars lists the variables a configuration struct reads (its env,
// envDefault, desc and secret tags), embedded structs included, in
// declaration order.
func Vars(cfg any) []Var {
	var out []Var
	walk(reflect.ValueOf(cfg), func(f reflect.StructField, _ reflect.Value) {
		out = append(out, Var{
			Name:        EnvPrefix + f.Tag.Get("env"),
			Default:     f.Tag.Get("envDefault"),
			Description: f.Tag.Get("desc"),
			Secret:      f.Tag.Get("secret") == "true",
		})
	})
	return out
}

// Names are the variable names of Vars.
func Names(cfgs ...any) []string {
	var out []string
	for _, c := range cfgs {
		for _, v := range Vars(c) {
			out = append(out, v.Name)
		}
	}
	return out
}

// walk calls f for every field with an env tag, descending into embedded
// and nested structs.
func walk(v reflect.Value, f func(reflect.StructField, reflect.Value)) {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		v = v.Elem()
	}
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		if tag := sf.Tag.Get("env"); tag != "" && tag != "-" {
			f(sf, v.Field(i))
			continue
		}
		if sf.Type.Kind() == reflect.Struct && sf.Tag.Get("env") != "-" {
			walk(v.Field(i), f)
		}
	}
}

// Redacted returns a configuration struct as NAME=value pairs, secrets
// masked (a URL keeps all but its password): safe to log.
func Redacted(cfg any) []string {
	var out []string
	walk(reflect.ValueOf(cfg), func(f reflect.StructField, fv reflect.Value) {
		val := fmt.Sprint(fv.Interface())
		if s, ok := fv.Interface().([]string); ok {
			val = strings.Join(s, ",")
		}
		if f.Tag.Get("secret") == "true" && val != "" {
			if u, err := url.Parse(val); err == nil && u.Scheme != "" && u.Host != "" {
				if _, has := u.User.Password(); has {
					u.User = url.UserPassword(u.User.Username(), "xxxxx")
				}
				val = u.Redacted()
			} else {
				val = "*****"
			}
		}
		out = append(out, EnvPrefix+f.Tag.Get("env")+"="+val)
	})
	return out
}

// ToolingVars are SLUICE_* variables read by the test and benchmark
// scripts, not by the binary: they are not reported as unknown.
var ToolingVars = []string{"SLUICE_FUZZTIME", "SLUICE_UPDATE_README", "SLUICE_UPDATE_SCREENSHOTS", "SLUICE_HAMMER", "SLUICE_SOAK",
	"SLUICE_CONFORMANCE_SEED", "SLUICE_CONFORMANCE_CASES", "SLUICE_CHROMIUM"}

// UnknownVariables reports every SLUICE_* variable of environ (nil: the
// process environment) that is not one of known, naming the closest known
// name: a misspelt SLUICE_RULE must not leave the default rules in force
// unnoticed.
func UnknownVariables(environ map[string]string, known []string) error {
	if environ == nil {
		environ = map[string]string{}
		for _, kv := range os.Environ() {
			k, v, _ := strings.Cut(kv, "=")
			environ[k] = v
		}
	}
	set := map[string]bool{}
	for _, k := range known {
		set[k] = true
	}
	for _, k := range ToolingVars {
		set[k] = true
	}
	var names []string
	for k := range environ {
		if strings.HasPrefix(k, EnvPrefix) && !set[k] {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	var errs []error
	for _, k := range names {
		hint := ""
		if near := closest(k, known); near != "" {
			hint = "; did you mean " + near + "?"
		}
		errs = append(errs, fmt.Errorf("%w: %s is not a Sluice variable%s", ErrConfig, k, hint))
	}
	return errors.Join(errs...)
}

// closest returns the known name nearest to name by edit distance, if it
// is near enough to be a slip (at most a third of the name's length).
func closest(name string, known []string) string {
	best, bestD := "", len(name)/3+1
	for _, k := range known {
		if d := editDistance(name, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
