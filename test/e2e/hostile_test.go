//go:build linux

package e2e

import (
	"crypto/tls"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// sendRaw writes payload on a new connection, optionally half-closes, and
// reads whatever comes back until the server closes or 1 s passes.
func sendRaw(addr string, payload []byte, halfClose bool) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := c.Write(payload); err != nil {
		return "", err
	}
	if halfClose {
		c.(*net.TCPConn).CloseWrite()
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	b, _ := io.ReadAll(c)
	return string(b), nil
}

func noSpansUnder(prefix string) func(t *testing.T, k *kernelRun, _ map[string]string) {
	return func(t *testing.T, k *kernelRun, _ map[string]string) {
		for _, s := range k.spans.all {
			if strings.HasPrefix(s.Path(), prefix) {
				t.Errorf("span for bytes that are not an HTTP exchange gymtrace should report: %v", s)
			}
		}
	}
}

func hostile(name string, payload func(addr string) []byte, halfClose bool) scenario {
	return scenario{
		name: name,
		drive: func(addr string) (map[string]string, error) {
			_, err := sendRaw(addr, payload(addr), halfClose)
			return nil, err
		},
		check: noSpansUnder("/" + name + "/"),
	}
}

// hostileScenarios: bytes that are not (valid) HTTP/1.x on traced sockets.
var hostileScenarios = []scenario{
	hostile("hostile-garbage", func(string) []byte {
		b := make([]byte, 4096)
		rand.New(rand.NewSource(1)).Read(b)
		return b
	}, true),
	hostile("hostile-truncated", func(string) []byte { return []byte("GET /hostile-truncated/echo") }, true),
	hostile("hostile-badmethod", func(addr string) []byte {
		return []byte(request(addr, "FOO", "/hostile-badmethod/echo", nil, ""))
	}, false),
	hostile("hostile-lowercase", func(addr string) []byte {
		return []byte(request(addr, "get", "/hostile-lowercase/echo", nil, ""))
	}, false),
	hostile("hostile-h2preface", func(string) []byte {
		// HTTP/2 prior knowledge: the preface, then an empty SETTINGS frame.
		return []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
	}, false),
	hostile("hostile-responseasrequest", func(string) []byte {
		return []byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
	}, false),
	{
		// A real TLS ClientHello on the plaintext port.
		name: "hostile-tls",
		drive: func(addr string) (map[string]string, error) {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				return nil, err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(2 * time.Second))
			tc := tls.Client(c, &tls.Config{ServerName: "gymtrace.test", InsecureSkipVerify: true})
			if err := tc.Handshake(); err == nil {
				return nil, fmt.Errorf("a TLS handshake with a plaintext server succeeded")
			}
			return nil, nil
		},
	},
	{
		// A 64 KiB request line: a real request the server answers; any span
		// it gives is for that path, cut short.
		name: "hostile-longline",
		drive: func(addr string) (map[string]string, error) {
			path := "/hostile-longline/" + strings.Repeat("a", 64<<10) + "/echo"
			resp, err := sendRaw(addr, []byte(request(addr, "GET", path, []string{"Connection: close"}, "")), false)
			if err == nil && !strings.HasPrefix(resp, "HTTP/1.1 200") {
				err = fmt.Errorf("64 KiB request line answered %.40q", resp)
			}
			return nil, err
		},
		check: func(t *testing.T, k *kernelRun, _ map[string]string) {
			for _, s := range k.spans.all {
				if p := s.Path(); strings.HasPrefix(p, "/hostile-longline/") && len(p) > 4096 {
					t.Errorf("a path of %d bytes left the kernel", len(p))
				}
			}
		},
	},
	{
		// A valid request, then garbage on the same connection.
		name: "hostile-afterbinary",
		drive: func(addr string) (map[string]string, error) {
			payload := request(addr, "GET", "/hostile-afterbinary/ok/echo", nil, "") + "\x00\x01\x02\xff\xfe binary junk\r\n\r\n"
			resp, err := sendRaw(addr, []byte(payload), false)
			if err == nil && !strings.HasPrefix(resp, "HTTP/1.1 200") {
				err = fmt.Errorf("answered %.40q", resp)
			}
			return nil, err
		},
		check: func(t *testing.T, k *kernelRun, _ map[string]string) {
			k.exchange(t, "GET", "/hostile-afterbinary/ok/echo", 200, "")
			if n := len(k.spans.all); n == 0 {
				t.Error("no spans at all")
			}
		},
	},
	{
		// Upgrade: after the 101 the connection carries another protocol;
		// HTTP-looking bytes inside it are not HTTP exchanges.
		name: "hostile-upgrade",
		drive: func(addr string) (map[string]string, error) {
			c, err := dialRaw(addr)
			if err != nil {
				return nil, err
			}
			defer c.close()
			r, err := c.roundTrip("GET", "/hostile-upgrade/upgrade", []string{"Connection: Upgrade", "Upgrade: websocket",
				"Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="}, "")
			if err != nil || r.status != 101 {
				return nil, fmt.Errorf("upgrade: %+v %v", r, err)
			}
			inner := request(addr, "GET", "/hostile-upgrade/inside/echo", nil, "")
			if err := c.send(0, inner); err != nil {
				return nil, err
			}
			buf := make([]byte, len(inner))
			if _, err := io.ReadFull(c.br, buf); err != nil || string(buf) != inner {
				return nil, fmt.Errorf("echo through the upgraded connection: %q %v", buf, err)
			}
			return nil, nil
		},
		check: func(t *testing.T, k *kernelRun, _ map[string]string) {
			k.exchange(t, "GET", "/hostile-upgrade/upgrade", 101, "")
			noSpansUnder("/hostile-upgrade/inside/")(t, k, nil)
		},
	},
	{
		// Traffic still traced after all of the above.
		name: "hostile-valid",
		drive: func(addr string) (map[string]string, error) {
			return oneConn(addr, func(c *rawClient) (map[string]string, error) {
				if err := c.expect("POST", "/hostile-valid/1/echo", nil, "fine", 200); err != nil {
					return nil, err
				}
				return nil, c.expect("GET", "/hostile-valid/2/echo", nil, "", 200)
			})
		},
		check: func(t *testing.T, k *kernelRun, _ map[string]string) {
			k.exchange(t, "POST", "/hostile-valid/1/echo", 200, "")
			k.exchange(t, "GET", "/hostile-valid/2/echo", 200, "")
		},
	},
}

// TestHostileBytes: garbage, truncated and oversized request lines, unknown
// methods, HTTP/2 and TLS on a plaintext port, a websocket upgrade. No bogus
// span, gymtrace stays up, the kernel's counters say what it ignored, and
// traffic after it is traced.
func TestHostileBytes(t *testing.T) {
	k := runKernel(t, "127.0.0.1:0", "server,http_client", hostileScenarios)
	checkNoStraySpans(t, k, hostileScenarios, nil)
	kc := kernelCounters(k.metrics)
	ignored := kc[`gymtrace_kernel_events_total{reason="not_http"}`] + kc[`gymtrace_kernel_events_total{reason="parse_error"}`] +
		kc[`gymtrace_kernel_events_total{reason="hdr_truncated"}`]
	if ignored == 0 {
		t.Errorf("the kernel counted nothing as ignored (not_http, parse_error, hdr_truncated): %v", kc)
	}
	t.Logf("kernel counters after hostile input: %v", kc)
}

// secretScenarios send a known secret through every place a request and a
// response can carry one.
var secretScenarios = []scenario{
	{
		name: "secrets-headers",
		drive: func(addr string) (map[string]string, error) {
			return oneConn(addr, func(c *rawClient) (map[string]string, error) {
				r, err := c.roundTrip("GET", "/secrets-headers/secret", []string{
					"Authorization: Bearer " + secretToken,
					"Cookie: s=" + secretToken + "; other=1",
					"Proxy-Authorization: Basic " + secretToken,
					"X-Api-Key: " + secretToken,
				}, "")
				if err != nil || r.status != 200 || !strings.Contains(r.body, secretToken) {
					return nil, fmt.Errorf("%+v %v", r, err)
				}
				return nil, nil
			})
		},
		check: func(t *testing.T, k *kernelRun, _ map[string]string) {
			k.exchange(t, "GET", "/secrets-headers/secret", 200, "")
		},
	},
	{
		name: "secrets-query",
		drive: func(addr string) (map[string]string, error) {
			return oneConn(addr, func(c *rawClient) (map[string]string, error) {
				if err := c.expect("GET", "/secrets-query/1/echo?token="+secretToken+"&x=1", nil, "", 200); err != nil {
					return nil, err
				}
				return nil, c.expect("POST", "/secrets-query/2/echo?"+secretToken, nil, "{}", 200)
			})
		},
		check: func(t *testing.T, k *kernelRun, _ map[string]string) {
			k.exchange(t, "GET", "/secrets-query/1/echo", 200, "")
			k.exchange(t, "POST", "/secrets-query/2/echo", 200, "")
		},
	},
	{
		name: "secrets-body",
		drive: func(addr string) (map[string]string, error) {
			return oneConn(addr, func(c *rawClient) (map[string]string, error) {
				if err := c.expect("POST", "/secrets-body/1/echo", []string{"Content-Type: application/json"},
					`{"api_key": "`+secretToken+`", "input": "hello"}`, 200); err != nil {
					return nil, err
				}
				// A chunked request body too.
				head := "POST /secrets-body/2/echo HTTP/1.1\r\nHost: " + addr + "\r\nTransfer-Encoding: chunked\r\n\r\n"
				if err := c.send(0, head+chunk(`{"password": "`+secretToken+`"}`)+"0\r\n\r\n"); err != nil {
					return nil, err
				}
				if r, err := c.read("POST"); err != nil || r.status != 200 {
					return nil, fmt.Errorf("chunked upload: %+v %v", r, err)
				}
				return nil, nil
			})
		},
		check: func(t *testing.T, k *kernelRun, _ map[string]string) {
			k.exchange(t, "POST", "/secrets-body/1/echo", 200, "")
			k.exchange(t, "POST", "/secrets-body/2/echo", 200, "")
		},
	},
	{
		// Go's client: credentials in the URL become an Authorization header.
		name: "secrets-goclient",
		drive: func(addr string) (map[string]string, error) {
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			u := &url.URL{Scheme: "http", Host: addr, Path: "/secrets-goclient/secret", RawQuery: "key=" + secretToken,
				User: url.UserPassword("user", secretToken)}
			req, _ := http.NewRequest("POST", u.String(), strings.NewReader("password="+secretToken))
			req.Header.Set("Cookie", "session="+secretToken)
			resp, err := cl.Do(req)
			if err != nil {
				return nil, err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return nil, nil
		},
		check: func(t *testing.T, k *kernelRun, _ map[string]string) {
			k.exchange(t, "POST", "/secrets-goclient/secret", 200, "")
		},
	},
}

// TestSecrets: no header value other than traceparent and Host, no query and
// no body byte reaches an export or a log, even at debug level.
func TestSecrets(t *testing.T) {
	k := runKernel(t, "127.0.0.1:0", "all", secretScenarios, "--log-level", "debug")
	checkNoStraySpans(t, k, secretScenarios, nil)
	for what, s := range map[string]string{"the exported spans": k.jsonl, "gymtrace's stdout": k.stdout, "gymtrace's stderr": k.stderr} {
		if i := strings.Index(s, "SECRET"); i >= 0 {
			lo, hi := max(0, i-200), min(len(s), i+100)
			t.Errorf("a secret reached %s: ...%s...", what, s[lo:hi])
		}
	}
	if len(k.jsonl) == 0 {
		t.Error("nothing was exported, so nothing was checked")
	}
}
