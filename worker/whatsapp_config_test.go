package worker_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/worker"
)

// WhatsApp's providers are configured like SMS's: SLUICE_WHATSAPP_SENDER
// and a list with named providers for failover; the Cloud API's settings
// are checked, naming each variable, and its token never logged.
func TestConfigWhatsAppProviders(t *testing.T) {
	t.Parallel()
	base := map[string]string{"SLUICE_SUBJECT_SECRET": "0123456789abcdef", "SLUICE_PAYLOAD_KEYS": testKeys,
		"SLUICE_WHATSAPP_SENDER": "cloud", "SLUICE_WHATSAPP_ACCESS_TOKEN": "EAAG-secret-token", "SLUICE_WHATSAPP_PHONE_NUMBER_ID": "106540352242922",
		"SLUICE_WHATSAPP_PROVIDERS": "default,backup", "SLUICE_PROVIDER_BACKUP_WHATSAPP_SENDER": "log"}
	cfg, err := worker.ParseConfig(base)
	if err != nil {
		t.Fatal(err)
	}
	specs, err := cfg.Providers(tasks.WhatsApp)
	if err != nil || len(specs) != 2 || specs[0].Kind != "cloud" || specs[1].Name != "backup" || specs[1].Kind != "log" {
		t.Fatalf("providers: %+v, %v", specs, err)
	}
	if all := strings.Join(cfg.Redacted(), "\n"); strings.Contains(all, "EAAG-secret-token") || !strings.Contains(all, "SLUICE_WHATSAPP_BASE_URL=https://graph.facebook.com/v23.0") {
		t.Errorf("Redacted:\n%s", all)
	}
	for want, unset := range map[string]string{"SLUICE_WHATSAPP_ACCESS_TOKEN": "SLUICE_WHATSAPP_ACCESS_TOKEN", "SLUICE_WHATSAPP_PHONE_NUMBER_ID": "SLUICE_WHATSAPP_PHONE_NUMBER_ID"} {
		env := map[string]string{}
		for k, v := range base {
			if k != unset {
				env[k] = v
			}
		}
		if _, err := worker.ParseConfig(env); !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("without %s: %v", unset, err)
		}
	}
	base["SLUICE_WHATSAPP_SENDER"] = "twilio"
	if _, err := worker.ParseConfig(base); !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), "SLUICE_WHATSAPP_SENDER must be log or cloud") {
		t.Errorf("an unknown WhatsApp sender: %v", err)
	}
}
