//go:build linux

package inject

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"
)

// recorder is a TCP (or TLS) server that keeps every byte each connection
// sent, keyed by the client's port.
type recorder struct {
	ln   net.Listener
	mu   sync.Mutex
	cond *sync.Cond
	data map[int][]byte
}

func newRecorder(t testing.TB, useTLS bool) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if useTLS {
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}})
	}
	r := &recorder{ln: ln, data: map[int][]byte{}}
	r.cond = sync.NewCond(&r.mu)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				port := c.RemoteAddr().(*net.TCPAddr).Port
				r.mu.Lock()
				r.data[port] = b
				r.cond.Broadcast()
				r.mu.Unlock()
			}()
		}
	}()
	return r
}

func (r *recorder) addr() string { return r.ln.Addr().String() }

func (r *recorder) wait(t testing.TB, port int) []byte {
	t.Helper()
	timer := time.AfterFunc(10*time.Second, func() { r.mu.Lock(); r.cond.Broadcast(); r.mu.Unlock() })
	defer timer.Stop()
	start := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		if b, ok := r.data[port]; ok {
			return b
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the server never saw the connection from port %d end", port)
		}
		r.cond.Wait()
	}
}

func selfSigned(t testing.TB) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
