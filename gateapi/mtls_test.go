package gateapi_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/paygate/paygate/gateapi"
	"github.com/paygate/paygate/internal/testtls"
)

// With a client CA and no tokens, a verified client certificate is the caller's credential: a caller with
// one is answered, one without never completes the handshake.
func TestClientCertificates(t *testing.T) {
	_, l := serve(t)
	ca := testtls.NewCA(t)
	srv := httptest.NewUnstartedServer(gateapi.New(gateapi.Options{Gate: l}))
	srv.TLS = ca.RequireClients()
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake's line
	srv.StartTLS()
	defer srv.Close()
	pem, err := os.ReadFile(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	client := func(certs ...tls.Certificate) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs}}}
	}
	certFile, keyFile := ca.Client(t, "checkout")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client(cert).Post(srv.URL+"/v1/providers/acme/allow", "application/json", strings.NewReader(`{"id":"m-1"}`))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("with a certificate: %v %v", resp, err)
	}
	resp.Body.Close()
	if resp, err := client().Post(srv.URL+"/v1/providers/acme/allow", "application/json", strings.NewReader(`{"id":"m-2"}`)); err == nil {
		resp.Body.Close()
		t.Fatalf("without a certificate: %d, want the handshake refused", resp.StatusCode)
	}
}
