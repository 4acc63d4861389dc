//go:build sluice_testhooks

package ses

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
)

// In a binary built with -tags sluice_testhooks (the e2e tests' second
// build, never the production one), SLUICETEST_SNS_HOST names one more
// host:port that may serve SNS's certificates and SubscribeURLs, and
// SLUICETEST_SNS_CA_FILE the PEM roots its TLS certificate chains to: the
// e2e tests serve SNS from loopback.
func init() {
	applyTestHooks = func(p *Provider) {
		host := os.Getenv("SLUICETEST_SNS_HOST")
		if host == "" {
			return
		}
		p.AllowHost = func(h string) bool { return h == host }
		if f := os.Getenv("SLUICETEST_SNS_CA_FILE"); f != "" {
			pem, err := os.ReadFile(f)
			if err != nil {
				panic("SLUICETEST_SNS_CA_FILE: " + err.Error())
			}
			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(pem)
			p.Client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
		}
	}
}
