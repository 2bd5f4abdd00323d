//go:build linux

package tls

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/gymtrace/gymtrace/internal/probesite"
)

// TestProbeCost measures what one uprobe hit costs a Python process doing
// TLS through memory BIOs, per probe placement. It is a measurement, not a
// check (it logs figures for docs/tls.md); run it with
//
//	sudo GYMTRACE_TLS_COST=1 go test ./internal/tls -run TestProbeCost -v
func TestProbeCost(t *testing.T) {
	if os.Getenv("GYMTRACE_TLS_COST") == "" {
		t.Skip("a measurement: set GYMTRACE_TLS_COST=1 (root) to run it")
	}
	requireRoot(t)
	lib := "/usr/lib/x86_64-linux-gnu/libssl.so.3"
	f, err := elf.Open(lib)
	if err != nil {
		t.Skipf("no Debian libssl.so.3: %v", err)
	}
	syms, _ := f.DynamicSymbols()
	addr := map[string]uint64{}
	for _, s := range syms {
		addr[s.Name] = s.Value
	}
	off := func(name string) uint64 {
		o, err := probesite.FileOffset(f, addr[name])
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	wInt, ok1 := wrapperCallTarget(f, addr["SSL_write_ex"])
	rInt, ok2 := wrapperCallTarget(f, addr["SSL_read_ex"])
	if !ok1 || !ok2 {
		t.Skip("this libssl does not have the SSL_*_ex wrapper pattern")
	}
	wIntOff, _ := probesite.FileOffset(f, wInt)
	rIntOff, _ := probesite.FileOffset(f, rInt)
	f.Close()

	counter, prog := countingProg(t)
	py := startBIOLoop(t)
	const n = 20000

	type probe struct {
		off uint64
		ret bool
	}
	cases := []struct {
		name  string
		hits  int // probe hits per iteration (1 write + 1 read)
		probe []probe
	}{
		{"none", 0, nil},
		{"uprobe SSL_write_ex+0 (sub: single-stepped)", 1, []probe{{off("SSL_write_ex"), false}}},
		{"uprobe SSL_write_ex+4 (call: emulated)", 1, []probe{{off("SSL_write_ex") + 4, false}}},
		{"uprobe ssl_write_internal+0 (push: emulated)", 1, []probe{{wIntOff, false}}},
		{"uretprobe ssl_write_internal (push entry + return trampoline)", 1, []probe{{wIntOff, true}}},
		{"uprobe+uretprobe ssl_write_internal", 2, []probe{{wIntOff, false}, {wIntOff, true}}},
		{"uretprobe SSL_read_ex (sub entry + return trampoline)", 1, []probe{{off("SSL_read_ex"), true}}},
		{"uprobe+uretprobe ssl_read_internal + ssl_write_internal", 4,
			[]probe{{rIntOff, false}, {rIntOff, true}, {wIntOff, false}, {wIntOff, true}}},
	}
	ex, err := link.OpenExecutable(lib)
	if err != nil {
		t.Fatal(err)
	}
	const rounds = 7
	results := make([][]float64, len(cases))
	for round := 0; round < rounds; round++ {
		for i, c := range cases {
			var links []link.Link
			for _, p := range c.probe {
				o := &link.UprobeOptions{Address: p.off, PID: py.pid}
				var l link.Link
				if p.ret {
					l, err = ex.Uretprobe("", prog, o)
				} else {
					l, err = ex.Uprobe("", prog, o)
				}
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				links = append(links, l)
			}
			_ = counter.Put(uint32(0), uint64(0))
			ns := py.run(t, n)
			var hits uint64
			_ = counter.Lookup(uint32(0), &hits)
			for _, l := range links {
				l.Close()
			}
			if want := uint64(2 * n * c.hits); hits != want { // 2n: warm-up run + measured run
				t.Errorf("%s: %d probe runs, want %d", c.name, hits, want)
			}
			results[i] = append(results[i], ns)
		}
	}
	base := median(results[0])
	t.Logf("%-62s %6.0f ns/iteration (median of %d)", cases[0].name, base, rounds)
	for i, c := range cases[1:] {
		m := median(results[i+1])
		t.Logf("%-62s %6.0f ns/iteration, %6.0f ns per iteration added (%d program runs)", c.name, m, m-base, c.hits)
	}
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (uprobes, BPF)")
	}
}

// countingProg is a uprobe program that counts its runs in an array map.
func countingProg(t *testing.T) (*ebpf.Map, *ebpf.Program) {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.Kprobe,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.StoreImm(asm.RFP, -4, 0, asm.Word),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
			asm.Mov.Imm(asm.R1, 1),
			asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return m, p
}

type bioLoop struct {
	pid int
	in  *bufio.Writer
	out *bufio.Scanner
}

// startBIOLoop runs a Python loop of SSLObject write + read over memory BIOs
// (what asyncio's sslproto does), one SSL_write_ex and one SSL_read_ex per
// iteration, no socket.
func startBIOLoop(t *testing.T) *bioLoop {
	t.Helper()
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	script := filepath.Join(dir, "bio.py")
	if err := os.WriteFile(script, []byte(bioScript), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/bin/python3", script, cert, key)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Skipf("starting /usr/bin/python3: %v", err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	b := &bioLoop{pid: cmd.Process.Pid, in: bufio.NewWriter(stdin), out: bufio.NewScanner(stdout)}
	if !b.out.Scan() || !strings.HasPrefix(b.out.Text(), "ready") {
		t.Fatalf("python BIO loop did not start: %q", b.out.Text())
	}
	return b
}

func (b *bioLoop) run(t *testing.T, n int) float64 {
	fmt.Fprintln(b.in, n)
	b.in.Flush()
	if !b.out.Scan() {
		t.Fatal("python BIO loop died")
	}
	v, err := strconv.ParseFloat(b.out.Text(), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// selfSigned writes a self-signed certificate for localhost/127.0.0.1 with
// the openssl CLI.
func selfSigned(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	out, err := exec.Command("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
		"-out", cert, "-days", "2", "-subj", "/CN=localhost",
		"-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1").CombinedOutput()
	if err != nil {
		t.Skipf("making a certificate with the openssl CLI: %v\n%s", err, out)
	}
	return cert, key
}

const bioScript = `
import ssl, sys, time, os
cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT); cctx.check_hostname = False; cctx.verify_mode = ssl.CERT_NONE
sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); sctx.load_cert_chain(sys.argv[1], sys.argv[2])
ci, co, si, so = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
c = cctx.wrap_bio(ci, co, server_hostname="localhost"); s = sctx.wrap_bio(si, so, server_side=True)
for _ in range(10):
    for o in (c, s):
        try: o.do_handshake()
        except ssl.SSLWantReadError: pass
    d = co.read()
    if d: si.write(d)
    d = so.read()
    if d: ci.write(d)
msg = b"x" * 200
def run(n):
    t = time.perf_counter_ns()
    for _ in range(n):
        c.write(msg); si.write(co.read()); s.read(4096)
    return (time.perf_counter_ns() - t) / n
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    run(n)
    print(f"{run(n):.0f}", flush=True)
`
