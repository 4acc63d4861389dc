package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/digest"
	"github.com/sluicehq/sluice/tasks"
)

// newTemplateCmd is `sluice template set|show|list|delete`: the tenants'
// digest templates.
func newTemplateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Manage a tenant's digest templates (the message of a digest rule)",
		Long: `A digest rule (CHANNEL.CATEGORY:digest=max:N, docs/rules.md) folds deferred
notifications into one message. Its subject, text and HTML part come from
built-in templates unless the tenant has its own for that channel and
category: Go text/template for the subject, the text and an SMS, html/template
(every value escaped) for the HTML part, each given the digest: .Count, .More
(items after the first), .First and .Items (each .ID, .Subject, .Body,
.Metadata, .EnqueuedAt). Templates run in a box, here and in the workers:
each part at most 1 MiB, 100,000 loop iterations, 4 MiB of values, 1 s;
no {{define}}, {{template}}, {{block}} or call; no control character in
the subject. A template that does not parse, or passes a limit on a sample
digest of 1,000 items, is refused here; one that passes a limit on a real
digest fails that digest (archived, reason template). Templates live in Redis; workers
read the one in force at each digest, so a change holds from the next.
Every change is versioned and says who made it.`,
	}
	cmd.AddCommand(newTemplateSetCmd(), newTemplateShowCmd(), newTemplateListCmd(), newTemplateDeleteCmd())
	return cmd
}

// templateTarget reads TENANT CHANNEL[.CATEGORY].
func templateTarget(args []string) (string, tasks.Channel, string, error) {
	tenant := args[0]
	if err := tasks.CheckTenant(tenant); err != nil {
		return "", "", "", usageError{err}
	}
	chs, cat, _ := strings.Cut(args[1], ".")
	ch := tasks.Channel(chs)
	if _, err := ch.TaskType(); err != nil {
		return "", "", "", usageError{err}
	}
	if cat != "" {
		if err := tasks.CheckCategory(cat); err != nil {
			return "", "", "", usageError{err}
		}
	}
	return tenant, ch, cat, nil
}

// withTemplates runs fn on the digest templates in the Redis the
// environment names, and closes the connection.
func withTemplates(fn func(*digest.Templates) error) error {
	d, _, err := openTool(false)
	if err != nil {
		return err
	}
	defer d.Close()
	return fn(digest.NewTemplates(d.Redis))
}

func newTemplateSetCmd() *cobra.Command {
	var t digest.Template
	var textFile, htmlFile, by string
	cmd := &cobra.Command{
		Use:   "set TENANT CHANNEL.CATEGORY",
		Short: "Set TENANT's digest template of a channel and category (replacing any)",
		Example: `  sluice template set acme email.comment --subject '{{.Count}} new comments' --text-file comments.txt --html-file comments.html
  sluice template set acme sms.alerts --text '{{.Count}} alerts: {{range .Items}}{{.Body}}; {{end}}'`,
		Args: argsError(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant, ch, cat, err := templateTarget(args)
			if err != nil {
				return err
			}
			if t.Text, err = secretFlag(cmd, t.Text, textFile, "text"); err != nil {
				return err
			}
			if t.HTML, err = secretFlag(cmd, t.HTML, htmlFile, "html"); err != nil {
				return err
			}
			if t.Subject == "" && t.Text == "" && t.HTML == "" {
				return usageError{errors.New("give at least one of --subject, --text (--text-file), --html (--html-file)")}
			}
			if err := t.Check(ch); err != nil {
				return usageError{err}
			}
			return withTemplates(func(ts *digest.Templates) error {
				got, err := ts.Set(cmd.Context(), tenant, ch, cat, t, who(by))
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "tenant %s: digest template of %s version %d set by %s\n", tenant, args[1], got.Version, got.By)
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&t.Subject, "subject", "", "the email subject's template (text/template)")
	f.StringVar(&t.Text, "text", "", "the text's template (text/template): the email's text part, or the SMS")
	f.StringVar(&textFile, "text-file", "", "read the text's template from this file (- for standard input)")
	f.StringVar(&t.HTML, "html", "", "the email's HTML part's template (html/template, every value escaped)")
	f.StringVar(&htmlFile, "html-file", "", "read the HTML template from this file (- for standard input)")
	f.StringVar(&by, "by", "", "who makes the change, for the record (default: user@host)")
	return cmd
}

func newTemplateShowCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show TENANT CHANNEL.CATEGORY",
		Short: "Print TENANT's digest template of a channel and category",
		Args:  argsError(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant, ch, cat, err := templateTarget(args)
			if err != nil {
				return err
			}
			var t *digest.Template
			if err := withTemplates(func(ts *digest.Templates) (err error) {
				t, err = ts.Get(cmd.Context(), tenant, ch, cat)
				return err
			}); err != nil {
				return err
			}
			if t == nil {
				return fmt.Errorf("tenant %s has no digest template of %s: the built-in one goes", tenant, args[1])
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(t)
			}
			fmt.Fprintf(out, "tenant %s, %s: version %d, set %s by %s\n", tenant, args[1], t.Version, t.At.Format("2006-01-02 15:04:05Z07:00"), t.By)
			for _, f := range []struct{ name, v string }{{"subject", t.Subject}, {"text", t.Text}, {"html", t.HTML}} {
				if f.v != "" {
					fmt.Fprintf(out, "--- %s\n%s\n", f.name, f.v)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print it as JSON")
	return cmd
}

func newTemplateListCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List every tenant's digest templates",
		Args:  argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var all map[string]digest.Template
			if err := withTemplates(func(ts *digest.Templates) (err error) {
				all, err = ts.List(cmd.Context())
				return err
			}); err != nil {
				return err
			}
			names := make([]string, 0, len(all))
			for k := range all {
				names = append(names, k)
			}
			sort.Strings(names)
			for _, k := range names {
				fmt.Fprintf(cmd.OutOrStdout(), "%s\tversion %d\t%s\n", k, all[k].Version, all[k].By)
			}
			return nil
		},
	}
}

func newTemplateDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "delete TENANT CHANNEL.CATEGORY",
		Short: "Delete TENANT's digest template of a channel and category (the built-in one goes again)",
		Args:  argsError(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant, ch, cat, err := templateTarget(args)
			if err != nil {
				return err
			}
			var ok bool
			if err := withTemplates(func(ts *digest.Templates) (err error) {
				ok, err = ts.Delete(cmd.Context(), tenant, ch, cat)
				return err
			}); err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("tenant %s has no digest template of %s", tenant, args[1])
			}
			fmt.Fprintf(cmd.OutOrStdout(), "tenant %s: digest template of %s deleted\n", tenant, args[1])
			return nil
		},
	}
}
