package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/sender/smtp"
)

func newDKIMCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dkim",
		Short: "DKIM tools: the DNS record of the signing key",
	}
	var keyFile, selector, domain string
	record := &cobra.Command{
		Use:   "record",
		Short: "Print the DNS TXT record that publishes the DKIM public key",
		Long: `Print, as a zone-file line, the TXT record to publish at
SELECTOR._domainkey.DOMAIN for the DKIM key the workers sign with
(SLUICE_DKIM_KEY_FILE, SLUICE_DKIM_SELECTOR, SLUICE_DKIM_DOMAIN unless the
flags say otherwise):

  s2026._domainkey.acme.example. IN TXT ( "v=DKIM1; k=rsa; p=MIIBIjAN…" "…IDAQAB" )

RSA keys are published as their SubjectPublicKeyInfo (RFC 6376), Ed25519 keys
as the raw 32-byte key with k=ed25519 (RFC 8463). The value is split into
quoted strings of at most 255 bytes, as DNS requires; resolvers join them
again. In a DNS provider's web form, enter the strings one after the other
(or joined, if the form splits long values itself).`,
		Args: argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if keyFile == "" {
				return usageError{fmt.Errorf("--key-file (or SLUICE_DKIM_KEY_FILE) is required")}
			}
			name, err := smtp.DKIMRecordName(selector, domain)
			if err != nil {
				return usageError{fmt.Errorf("--selector and --domain (or SLUICE_DKIM_SELECTOR and SLUICE_DKIM_DOMAIN): %w", err)}
			}
			key, err := smtp.LoadDKIMKey(keyFile)
			if err != nil {
				return fmt.Errorf("%s: %w", keyFile, err)
			}
			value, err := smtp.DKIMPublicKeyRecord(key)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), zoneTXT(name, smtp.DKIMRecordStrings(value)))
			return nil
		},
	}
	fl := record.Flags()
	fl.StringVar(&keyFile, "key-file", os.Getenv(config.EnvPrefix+"DKIM_KEY_FILE"), "PEM private key (RSA or Ed25519) (default $SLUICE_DKIM_KEY_FILE)")
	fl.StringVar(&selector, "selector", os.Getenv(config.EnvPrefix+"DKIM_SELECTOR"), "selector, s= (default $SLUICE_DKIM_SELECTOR)")
	fl.StringVar(&domain, "domain", os.Getenv(config.EnvPrefix+"DKIM_DOMAIN"), "signing domain, d= (default $SLUICE_DKIM_DOMAIN)")
	cmd.AddCommand(record)
	return cmd
}

// zoneTXT writes a TXT record as a zone-file line (RFC 1035 5.1): the
// owner name fully qualified, each character-string quoted, within
// parentheses when there are several.
func zoneTXT(name string, strs []string) string {
	quoted := make([]string, len(strs))
	for i, s := range strs {
		s = strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), `"`, `\"`)
		quoted[i] = `"` + s + `"`
	}
	if len(quoted) == 1 {
		return name + ". IN TXT " + quoted[0]
	}
	return name + ". IN TXT ( " + strings.Join(quoted, " ") + " )"
}
