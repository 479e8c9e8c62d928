package testtls_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"testing"

	"github.com/paygate/paygate/internal/testtls"
)

// The proxy forwards a client that trusts the CA to the backend, and refuses one that does not before a
// byte of it reaches the backend.
func TestProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // an echo server, line by line
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				_, _ = c.Write([]byte(line))
			}()
		}
	}()
	ca := testtls.NewCA(t)
	p := ca.Proxy(t, ln.Addr().String())
	pem, err := os.ReadFile(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatal("no certificate in the CA file")
	}
	for _, name := range []string{"127.0.0.1", "localhost"} {
		c, err := tls.Dial("tcp", p.Addr, &tls.Config{RootCAs: roots, ServerName: name, MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := c.Write([]byte("hello\n")); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(c).ReadString('\n'); line != "hello\n" {
			t.Fatalf("%s: echo %q %v", name, line, err)
		}
		c.Close()
	}
	_, err = tls.Dial("tcp", p.Addr, &tls.Config{MinVersion: tls.VersionTLS12}) // the system's roots
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Fatalf("without the CA: %v, want an unknown authority", err)
	}
	if p.Forwarded() != 2 {
		t.Fatalf("forwarded %d connections, want 2", p.Forwarded())
	}
}
