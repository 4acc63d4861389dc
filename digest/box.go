package digest

import (
	"bytes"
	"errors"
	"fmt"
	htmltemplate "html/template"
	"reflect"
	"strings"
	"text/template"
	"text/template/parse"
	"time"
	"unicode"
	"unicode/utf8"
)

// A digest's templates run in a box (DESIGN.md invariant 24): a tenant's
// template can cost its own digest, never the process that renders it.
// The same box holds when a template is set (Template.Check, on a sample
// digest of plans.MaxDigestItems items) and when a worker renders it:
//
//   - output: each part is written through a writer that takes at most
//     Limits.Bytes; an SMS keeps its first tasks.MaxSMSRunes characters
//     (the rest is counted, not kept);
//   - loops: every {{range}} iteration is a step, at most Limits.Steps
//     per render, and the clock is read at each: at most Limits.Time;
//   - values: print, printf, println, html, js and urlquery make new
//     strings; they may make at most Limits.Values bytes per render, and
//     each refuses a call whose result could pass that before making it;
//   - what cannot be bounded is refused when the template is parsed:
//     {{template}}, {{define}} and {{block}} (recursion), call, and a
//     method given anything but literals (a method of time.Time could
//     grow a value from a variable without a bound).
//
// The digest's values print as bounded text (View's types implement
// fmt.Formatter), so printing .Items never formats every item's body.

// Limits bound one render of a digest's templates.
type Limits struct {
	// Bytes is the most one part (subject, text, HTML, SMS) may write.
	Bytes int
	// Steps is the most loop iterations of one render.
	Steps int
	// Values is the most bytes the string functions may make in one render.
	Values int
	// Time is the longest one render may run, by the wall clock: a
	// backstop behind Steps, Bytes and Values, which bound the work itself.
	Time time.Duration
}

// DefaultLimits are the box's limits (docs/security.md lists them). Time
// is 5 s: at 1 s the set-time check of a legitimate template on the
// 1,000-item sample was refused on a loaded machine (load average 20 on two
// cores, the race detector on), a refusal that says nothing of the
// template.
var DefaultLimits = Limits{Bytes: 1 << 20, Steps: 100_000, Values: 4 << 20, Time: 5 * time.Second}

// ErrLimit reports a render stopped at one of its limits. At set time the
// template is refused (wrapped in ErrBadTemplate); at send time the digest
// fails with reason tasks.ReasonTemplate.
var ErrLimit = errors.New("digest: template over its limits")

// limitError is a render stopped at a limit: the reason, whatever the
// template package wrapped around it.
type limitError struct{ why string }

func (e *limitError) Error() string { return ErrLimit.Error() + ": " + e.why }
func (e *limitError) Unwrap() error { return ErrLimit }

func overLimit(format string, args ...any) error {
	return &limitError{why: fmt.Sprintf(format, args...)}
}

// stepFunc is the name of the step counter the box puts at the top of
// every {{range}} body.
const stepFunc = "sluiceDigestStep"

// box is one render's budget.
type box struct {
	lim      Limits
	steps    int
	values   int
	deadline time.Time
}

func newBox(lim Limits) *box { return &box{lim: lim, deadline: time.Now().Add(lim.Time)} }

// step counts one loop iteration; false always (it sits in an {{if}}).
func (b *box) step() (bool, error) {
	b.steps++
	if b.steps > b.lim.Steps {
		return false, overLimit("more than %d loop iterations", b.lim.Steps)
	}
	if time.Now().After(b.deadline) {
		return false, overLimit("ran longer than %v", b.lim.Time)
	}
	return false, nil
}

// room refuses a value of up to n bytes that would pass the budget.
func (b *box) room(n int) error {
	if n < 0 || b.values+n > b.lim.Values {
		return overLimit("its functions would make more than %d bytes", b.lim.Values)
	}
	return nil
}

// made counts a value made.
func (b *box) made(s string) (string, error) {
	if err := b.room(len(s)); err != nil {
		return "", err
	}
	b.values += len(s)
	return s, nil
}

// funcs are the box's functions: the step counter and bounded versions of
// the builtins that make strings.
func (b *box) funcs() map[string]any {
	return map[string]any{
		stepFunc: b.step,
		"print": func(args ...any) (string, error) {
			if err := b.room(sizeOf(args...) + len(args)); err != nil {
				return "", err
			}
			return b.made(fmt.Sprint(args...))
		},
		"println": func(args ...any) (string, error) {
			if err := b.room(sizeOf(args...) + len(args) + 1); err != nil {
				return "", err
			}
			return b.made(fmt.Sprintln(args...))
		},
		"printf": func(format string, args ...any) (string, error) {
			if err := b.room(len(format) + widths(format) + 6*sizeOf(args...)); err != nil {
				return "", err
			}
			return b.made(fmt.Sprintf(format, args...))
		},
		"html": func(args ...any) (string, error) {
			if err := b.room(6 * sizeOf(args...)); err != nil {
				return "", err
			}
			return b.made(template.HTMLEscaper(args...))
		},
		"js": func(args ...any) (string, error) {
			if err := b.room(6 * sizeOf(args...)); err != nil {
				return "", err
			}
			return b.made(template.JSEscaper(args...))
		},
		"urlquery": func(args ...any) (string, error) {
			if err := b.room(3 * sizeOf(args...)); err != nil {
				return "", err
			}
			return b.made(template.URLQueryEscaper(args...))
		},
		"call": func(any, ...any) (any, error) { return nil, errors.New("call is not allowed in a digest template") },
	}
}

// scalarSize bounds how long a value that is not text prints (a number,
// a time, one of View's bounded types).
const scalarSize = 256

// sizeOf bounds how many bytes args print as.
func sizeOf(args ...any) int {
	n := 0
	for _, a := range args {
		switch v := a.(type) {
		case string:
			n += len(v)
		case []byte:
			n += len(v)
		case fmt.Formatter, nil:
			n += scalarSize
		default:
			rv := reflect.ValueOf(a)
			switch rv.Kind() {
			case reflect.String:
				n += rv.Len()
			case reflect.Slice, reflect.Array, reflect.Map, reflect.Struct, reflect.Pointer, reflect.Interface:
				n += 1 << 30 // a composite of unknown size: refused
			default:
				n += scalarSize
			}
		}
	}
	return n
}

// widths bounds the padding a format asks for: each width and precision
// (fmt caps each at 1e6; * takes one from the arguments).
func widths(format string) int {
	n := 0
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			continue
		}
		i++
		for i < len(format) && bytes.IndexByte([]byte("+-# 0"), format[i]) >= 0 {
			i++
		}
		num := func() {
			if i < len(format) && format[i] == '*' {
				n += 1_000_000
				i++
				return
			}
			v := 0
			for i < len(format) && format[i] >= '0' && format[i] <= '9' {
				v = min(v*10+int(format[i]-'0'), 1_000_000)
				i++
			}
			n += v
		}
		num()
		if i < len(format) && format[i] == '.' {
			i++
			num()
		}
	}
	return n
}

// stepNode is the node the box puts at the top of every {{range}} body.
var stepNode = func() parse.Node {
	t := template.Must(template.New("step").Funcs(template.FuncMap{stepFunc: func() (bool, error) { return false, nil }}).
		Parse("{{if " + stepFunc + "}}{{end}}"))
	return t.Tree.Root.Nodes[0]
}()

// confine checks a parsed template against what the box cannot bound and
// puts a step at the top of every loop body. trees are the templates
// the parse made (more than one: a {{define}}).
func confine(name string, trees int, root *parse.ListNode) error {
	if trees > 1 {
		return fmt.Errorf("%w: %s: {{define}} and {{block}} are not allowed in a digest template", ErrBadTemplate, name)
	}
	if err := confineList(root); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrBadTemplate, name, err)
	}
	return nil
}

func confineList(l *parse.ListNode) error {
	if l == nil {
		return nil
	}
	for _, n := range l.Nodes {
		if err := confineNode(n); err != nil {
			return err
		}
	}
	return nil
}

func confineNode(n parse.Node) error {
	switch n := n.(type) {
	case *parse.TemplateNode:
		return errors.New("{{template}} is not allowed in a digest template")
	case *parse.ActionNode:
		return confinePipe(n.Pipe)
	case *parse.IfNode:
		return confineBranch(&n.BranchNode)
	case *parse.WithNode:
		return confineBranch(&n.BranchNode)
	case *parse.RangeNode:
		if err := confineBranch(&n.BranchNode); err != nil {
			return err
		}
		if n.List == nil {
			n.List = &parse.ListNode{NodeType: parse.NodeList}
		}
		n.List.Nodes = append([]parse.Node{stepNode.Copy()}, n.List.Nodes...)
	}
	return nil
}

func confineBranch(b *parse.BranchNode) error {
	if err := confinePipe(b.Pipe); err != nil {
		return err
	}
	if err := confineList(b.List); err != nil {
		return err
	}
	return confineList(b.ElseList)
}

// confinePipe refuses call, and a method given anything but literals:
// its arguments, or the previous command's result.
func confinePipe(p *parse.PipeNode) error {
	if p == nil {
		return nil
	}
	for i, c := range p.Cmds {
		if len(c.Args) == 0 {
			continue
		}
		switch first := c.Args[0].(type) {
		case *parse.IdentifierNode:
			if first.Ident == "call" {
				return errors.New("call is not allowed in a digest template")
			}
		case *parse.FieldNode, *parse.ChainNode, *parse.VariableNode:
			if i > 0 {
				return fmt.Errorf("a method cannot take the result of a pipeline (%s)", c)
			}
			for _, a := range c.Args[1:] {
				switch a.(type) {
				case *parse.StringNode, *parse.NumberNode, *parse.BoolNode:
				default:
					return fmt.Errorf("a method takes only literal arguments (%s)", c)
				}
			}
		}
		for _, a := range c.Args {
			switch a := a.(type) {
			case *parse.PipeNode:
				if err := confinePipe(a); err != nil {
					return err
				}
			case *parse.ChainNode:
				if pn, ok := a.Node.(*parse.PipeNode); ok {
					if err := confinePipe(pn); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// parseText parses a text/template of the box.
func parseText(name, src string, b *box) (*template.Template, error) {
	t, err := template.New(name).Funcs(b.funcs()).Option("missingkey=error").Parse(src)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadTemplate, name, err)
	}
	if err := confine(name, len(t.Templates()), t.Tree.Root); err != nil {
		return nil, err
	}
	return t, nil
}

// parseHTML parses an html/template of the box.
func parseHTML(name, src string, b *box) (*htmltemplate.Template, error) {
	t, err := htmltemplate.New(name).Funcs(b.funcs()).Option("missingkey=error").Parse(src)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadTemplate, name, err)
	}
	if err := confine(name, len(t.Templates()), t.Tree.Root); err != nil {
		return nil, err
	}
	return t, nil
}

// errFull ends a trusted render (a built-in template) that reached its
// part's size: what it wrote so far is kept, cut.
var errFull = errors.New("digest: part full")

// partWriter takes what a template writes into one part: at most max
// bytes (past it ErrLimit, or errFull when cut), keeping at most
// keepRunes characters when keepRunes > 0 (an SMS).
type partWriter struct {
	buf       bytes.Buffer
	written   int
	max       int
	keepRunes int
	runes     int
	cut       bool // trusted: stop quietly where the part is full
	full      bool // it stopped there
	what      string
}

func (p *partWriter) Write(b []byte) (int, error) {
	if p.written+len(b) > p.max {
		if p.cut {
			p.keep(b[:p.max-p.written])
			p.written, p.full = p.max, true
			return 0, errFull
		}
		return 0, overLimit("the %s is over %d bytes", p.what, p.max)
	}
	p.written += len(b)
	p.keep(b)
	if p.cut && p.keepRunes > 0 && p.runes > p.keepRunes {
		return len(b), errFull // an SMS cut: nothing more would be kept
	}
	return len(b), nil
}

// keep stores b, up to keepRunes characters (and one more, to know that
// the text was cut).
func (p *partWriter) keep(b []byte) {
	if p.keepRunes <= 0 {
		p.buf.Write(b)
		return
	}
	for len(b) > 0 && p.runes <= p.keepRunes {
		_, size := utf8.DecodeRune(b)
		p.buf.Write(b[:size])
		b = b[size:]
		p.runes++
	}
}

// exec runs one part's template into a writer bounded as p says; cut
// renders (built-in templates) end quietly at the bound.
type executor interface {
	Execute(w ioWriter, data any) error
}

type ioWriter = interface{ Write([]byte) (int, error) }

func run(t executor, v View, p *partWriter) (string, error) {
	err := safeExecute(t, v, p)
	var le *limitError
	switch {
	case errors.Is(err, errFull):
		err = nil
	case errors.As(err, &le):
		err = le // its reason, without the template package's wrapping
	}
	out := p.buf.String()
	if p.full {
		out = cutBytes(out+"…", p.max)
	}
	if err == nil && !utf8.ValidString(out) {
		if !p.cut {
			return "", fmt.Errorf("%w: the %s it writes is not valid UTF-8", ErrBadTemplate, p.what)
		}
		out = strings.ToValidUTF8(out, "\uFFFD")
	}
	return out, err
}

// safeExecute turns a panic in a template's execution into an error: a
// tenant's template never takes the process down.
func safeExecute(t executor, v View, w ioWriter) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: the template panicked: %v", ErrBadTemplate, r)
		}
	}()
	return t.Execute(w, v)
}

type textExec struct{ t *template.Template }

func (e textExec) Execute(w ioWriter, data any) error { return e.t.Execute(w, data) }

type htmlExec struct{ t *htmltemplate.Template }

func (e htmlExec) Execute(w ioWriter, data any) error { return e.t.Execute(w, data) }

// headerSafe reports the first control character (but tab), or U+2028 or
// U+2029, in s: what a header field refuses.
func headerSafe(s string) error {
	for _, r := range s {
		if (r != '\t' && unicode.IsControl(r)) || r == '\u2028' || r == '\u2029' {
			return fmt.Errorf("holds the control character %U (a header field takes none but tab)", r)
		}
	}
	return nil
}
