package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/webhook"
)

// newWebhookCmd is `sluice webhook set|show|remove`: a tenant's credentials
// for its email providers' bounce and complaint webhooks.
func newWebhookCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Manage a tenant's provider webhooks (email bounces and complaints, WhatsApp)",
		Long: `sluice api takes each provider's bounce and complaint webhooks per tenant at
/v1/webhooks/PROVIDER/TENANT (` + strings.Join(app.WebhookNames(), ", ") + `), verified with the
credentials set here: SendGrid's verification key, Mailgun's webhook signing
key, Postmark's basic-auth user and password (and client addresses), the SNS
topics of SES, WhatsApp's app secret, phone-number ids and verify token. They are kept in Redis sealed with SLUICE_PAYLOAD_KEYS, which
must be the API's; a change holds from the next delivery (docs/channels.md).`,
	}
	cmd.AddCommand(newWebhookSetCmd(), newWebhookShowCmd(), newWebhookRemoveCmd())
	return cmd
}

func newWebhookSetCmd() *cobra.Command {
	var c webhook.Credentials
	var keyFile, passwordFile, parentKeyFile, tokenFile string
	cmd := &cobra.Command{
		Use:   "set TENANT PROVIDER",
		Short: "Set TENANT's credentials for PROVIDER's webhook (replacing any)",
		Example: `  sluice webhook set acme sendgrid --key-file sendgrid-verification-key.txt
  sluice webhook set acme mailgun --key-file - < signing-key
  sluice webhook set acme mailgun --parent-key-file primary-signing-key --account 1234567890303a4bd1f33898   # a subaccount
  sluice webhook set acme postmark --user sluice --password-file pm-pass --allow-ip 3.134.147.250
  sluice webhook set acme ses --topic arn:aws:sns:us-east-1:123456789012:ses-acme
  sluice webhook set acme whatsapp --key-file meta-app-secret --phone-number-id 106540352242922 --verify-token-file vt`,
		Args: argsError(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant, p, err := webhookTarget(args)
			if err != nil {
				return err
			}
			if c.Key, err = secretFlag(cmd, c.Key, keyFile, "key"); err != nil {
				return err
			}
			if c.Password, err = secretFlag(cmd, c.Password, passwordFile, "password"); err != nil {
				return err
			}
			if c.ParentKey, err = secretFlag(cmd, c.ParentKey, parentKeyFile, "parent-key"); err != nil {
				return err
			}
			if c.VerifyToken, err = secretFlag(cmd, c.VerifyToken, tokenFile, "verify-token"); err != nil {
				return err
			}
			if err := p.Check(c); err != nil {
				return usageError{err}
			}
			d, _, err := openTool(true)
			if err != nil {
				return err
			}
			defer d.Close()
			if err := webhook.NewStore(d.Redis, d.Keys).Set(cmd.Context(), tenant, p, c); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s webhook of tenant %s set: point it at BASE%s\n", p.Name(), tenant, webhook.Path(p.Name(), tenant))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.Key, "key", "", "SendGrid's verification key or Mailgun's webhook signing key (prefer --key-file)")
	f.StringVar(&keyFile, "key-file", "", "read the key from this file (- for standard input)")
	f.StringVar(&c.User, "user", "", "Postmark: the basic-auth user of the webhook URL")
	f.StringVar(&c.Password, "password", "", "Postmark: the basic-auth password (prefer --password-file)")
	f.StringVar(&passwordFile, "password-file", "", "read the password from this file (- for standard input)")
	f.StringArrayVar(&c.Topics, "topic", nil, "SES: an SNS topic ARN SES publishes the tenant's notifications to (repeatable)")
	f.StringArrayVar(&c.AllowIPs, "allow-ip", nil, "Postmark: the only client IPs or CIDR prefixes taken (repeatable; default any)")
	f.StringVar(&c.ParentKey, "parent-key", "", "Mailgun, a subaccount: the primary account's webhook signing key, which signs parent-signature (prefer --parent-key-file)")
	f.StringVar(&parentKeyFile, "parent-key-file", "", "read the parent key from this file (- for standard input)")
	f.StringVar(&c.Account, "account", "", "Mailgun, with --parent-key: the subaccount's id (account.id of its events); only its events are taken")
	f.StringArrayVar(&c.PhoneNumberIDs, "phone-number-id", nil, "WhatsApp: a business number (Cloud API phone-number id) the tenant owns (repeatable); --key is then the Meta app's secret")
	f.StringVar(&c.VerifyToken, "verify-token", "", "WhatsApp: the verify token Meta's check of the URL must carry (prefer --verify-token-file)")
	f.StringVar(&tokenFile, "verify-token-file", "", "read the verify token from this file (- for standard input)")
	return cmd
}

// webhookTarget reads TENANT PROVIDER.
func webhookTarget(args []string) (string, webhook.Provider, error) {
	if err := tasks.CheckTenant(args[0]); err != nil {
		return "", nil, usageError{err}
	}
	p, ok := app.LookupWebhook(args[1])
	if !ok {
		return "", nil, usageError{fmt.Errorf("no webhook provider %q: want one of %s", args[1], strings.Join(app.WebhookNames(), ", "))}
	}
	return args[0], p, nil
}

// secretFlag is a secret given as a value or read from a file ("-":
// standard input), trimmed of surrounding white space.
func secretFlag(cmd *cobra.Command, value, file, name string) (string, error) {
	if file == "" {
		return value, nil
	}
	if value != "" {
		return "", usageError{fmt.Errorf("--%s and --%s-file: give one", name, name)}
	}
	var raw []byte
	var err error
	if file == "-" {
		raw, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), 64<<10))
	} else {
		raw, err = os.ReadFile(file)
	}
	if err != nil {
		return "", fmt.Errorf("--%s-file: %w", name, err)
	}
	return strings.TrimSpace(string(raw)), nil
}

// webhookInfo is what show prints of one provider: never a secret.
type webhookInfo struct {
	Provider string   `json:"provider"`
	Path     string   `json:"path"`
	Topics   []string `json:"topics,omitempty"`
	AllowIPs []string `json:"allow_ips,omitempty"`
	User     string   `json:"user,omitempty"`
	Error    string   `json:"error,omitempty"`
}

func newWebhookShowCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show TENANT",
		Short: "List TENANT's provider webhooks and their paths (no secret is shown)",
		Args:  argsError(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := tasks.CheckTenant(args[0]); err != nil {
				return usageError{err}
			}
			d, _, err := openTool(true)
			if err != nil {
				return err
			}
			defer d.Close()
			st := webhook.NewStore(d.Redis, d.Keys)
			names, err := st.Providers(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			infos := []webhookInfo{}
			for _, n := range names {
				info := webhookInfo{Provider: n, Path: webhook.Path(n, args[0])}
				c, err := st.Get(cmd.Context(), args[0], n)
				if err != nil {
					info.Error = err.Error()
				}
				info.Topics, info.AllowIPs, info.User = c.Topics, c.AllowIPs, c.User
				infos = append(infos, info)
			}
			return printWebhooks(cmd.OutOrStdout(), args[0], infos, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printWebhooks(out io.Writer, tenant string, infos []webhookInfo, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(out).Encode(infos)
	}
	if len(infos) == 0 {
		fmt.Fprintf(out, "tenant %s has no provider webhook\n", tenant)
		return nil
	}
	for _, i := range infos {
		line := i.Provider + "\t" + i.Path
		if len(i.Topics) > 0 {
			line += "\ttopics " + strings.Join(i.Topics, ",")
		}
		if i.User != "" {
			line += "\tuser " + i.User
		}
		if len(i.AllowIPs) > 0 {
			line += "\tallow " + strings.Join(i.AllowIPs, ",")
		}
		if i.Error != "" {
			line += "\tunreadable: " + i.Error
		}
		fmt.Fprintln(out, line)
	}
	return nil
}

func newWebhookRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "remove TENANT PROVIDER",
		Short: "Remove TENANT's credentials for PROVIDER: its deliveries are refused (404) from then on",
		Args:  argsError(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant, p, err := webhookTarget(args)
			if err != nil {
				return err
			}
			d, _, err := openTool(false)
			if err != nil {
				return err
			}
			defer d.Close()
			ok, err := webhook.NewStore(d.Redis, nil).Delete(cmd.Context(), tenant, p.Name())
			if err != nil {
				return err
			}
			if !ok {
				return errors.New("tenant " + tenant + " had no " + p.Name() + " webhook")
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s webhook of tenant %s removed\n", p.Name(), tenant)
			return nil
		},
	}
}
