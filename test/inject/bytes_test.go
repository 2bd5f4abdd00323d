//go:build linux

package inject

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/internal/inject"
	"github.com/gymtrace/gymtrace/internal/inject/testbpf"
)

var injectedRE = regexp.MustCompile(`^traceparent: 00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]\r\n`)

// check compares what the server received with what the client meant to
// send. It returns the inserted traceparent values, one per request (""
// when none), or a description of the first difference.
func check(c connCase, got []byte) ([]string, error) {
	vals := make([]string, len(c.reqs))
	oi, gi := 0, 0
	same := func(to int) error {
		n := to - oi
		if gi+n > len(got) || !bytes.Equal(c.want[oi:to], got[gi:gi+n]) {
			k := 0
			for k < n && gi+k < len(got) && c.want[oi+k] == got[gi+k] {
				k++
			}
			return fmt.Errorf("byte %d of the intended stream differs (received %d bytes, intended %d): want %q, got %q",
				oi+k, len(got), len(c.want), snippet(c.want, oi+k), snippet(got, gi+k))
		}
		oi, gi = to, gi+n
		return nil
	}
	for i, r := range c.reqs {
		if err := same(r.lineEnd); err != nil {
			return nil, fmt.Errorf("before/in request %d (%s): %w", i, r.what, err)
		}
		if m := injectedRE.Find(got[gi:]); m != nil && !bytes.HasPrefix(c.want[oi:], m) {
			vals[i] = string(m[len("traceparent: ") : len(m)-2])
			gi += len(m)
		}
	}
	if err := same(len(c.want)); err != nil {
		return nil, fmt.Errorf("after the last request: %w", err)
	}
	if gi != len(got) {
		return nil, fmt.Errorf("%d extra bytes received: %q", len(got)-gi, snippet(got, gi))
	}
	return vals, nil
}

func snippet(b []byte, at int) string {
	if at >= len(b) {
		return "<end>"
	}
	return string(b[at:min(len(b), at+40)])
}

// TestByteExact: a traced Go client sends fuzzed request shapes over plain
// TCP and TLS; the server receives every intended byte plus exactly one
// header line where the rules say, and the kernel's request records name
// exactly the values that went on the wire.
func TestByteExact(t *testing.T) {
	needRoot(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GYMTRACE_INJECT_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (GYMTRACE_INJECT_SEED=%d reproduces)", seed, seed)
	g := &gen{r: mrand.New(mrand.NewPCG(seed, 7))}

	k := loadKernel(t, true)
	srv := newRecorder(t, false)
	tsrv := newRecorder(t, true)

	nconn := 40
	if testing.Short() {
		nconn = 10
	}
	var cases []connCase
	sc := scenario{Addr: srv.addr(), TLSAddr: tsrv.addr()}
	for i := 0; i < nconn; i++ {
		c := g.conn(1 + g.r.IntN(8))
		cases = append(cases, c)
		sc.Conns = append(sc.Conns, c.plan)
	}
	// TLS: the same shapes inside TLS get nothing (the socket carries
	// ciphertext), and arrive intact.
	for i := 0; i < 3; i++ {
		c := g.conn(3)
		c.plan.TLS = true
		for j := range c.reqs {
			c.reqs[j].expect = false
		}
		cases = append(cases, c)
		sc.Conns = append(sc.Conns, c.plan)
	}
	if only := os.Getenv("GYMTRACE_INJECT_ONLY"); only != "" {
		// Debugging: rerun one connection of a seed.
		i, _ := strconv.Atoi(only)
		cases, sc.Conns = cases[i:i+1], sc.Conns[i:i+1]
	}
	f, err := os.CreateTemp(t.TempDir(), "scenario-*.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.NewEncoder(f).Encode(sc); err != nil {
		t.Fatal(err)
	}
	f.Close()

	ch := startChild(t, "client", "GYMTRACE_INJECT_SCENARIO="+f.Name())
	k.addTarget(t, ch.pid())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	line, err := ch.run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Ports []int  `json:"ports"`
		Err   string `json:"err"`
	}
	if err := json.Unmarshal([]byte(line), &rep); err != nil || rep.Err != "" {
		t.Fatalf("client report %q: %v %s", line, err, rep.Err)
	}

	var wantInjected, gotInjected []string
	inserted := 0
	for i, c := range cases {
		rec := srv
		if c.plan.TLS {
			rec = tsrv
		}
		got := rec.wait(t, rep.Ports[i])
		vals, err := check(c, got)
		if err != nil {
			t.Errorf("connection %d (%d writes, tls=%v): %v", i, len(c.plan.Writes), c.plan.TLS, err)
			continue
		}
		for j, r := range c.reqs {
			if (vals[j] != "") != r.expect {
				t.Errorf("connection %d request %d (%s): inserted=%q, want inserted=%v\n%s", i, j, r.what, vals[j], r.expect, describe(c, vals))
			}
			if vals[j] != "" {
				inserted++
				wantInjected = append(wantInjected, vals[j])
			}
		}
	}
	// The kernel reports exactly the values it put on the wire.
	deadline := time.Now().Add(30 * time.Second) // a bound on a failure
	for {
		gotInjected = gotInjected[:0]
		for _, e := range k.requests(ch.pid()) {
			if e.Flags&testbpf.FlagInjected != 0 {
				gotInjected = append(gotInjected, string(e.Traceparent[:55]))
			}
		}
		if len(gotInjected) >= len(wantInjected) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	sort.Strings(wantInjected)
	sort.Strings(gotInjected)
	if strings.Join(wantInjected, ",") != strings.Join(gotInjected, ",") {
		t.Errorf("request records with GT_F_INJECTED (%d of %d records) do not match the headers on the wire (%d)",
			len(gotInjected), len(k.requests(ch.pid())), len(wantInjected))
	}
	st := k.stats(t)
	t.Logf("%d connections, %d requests, %d headers inserted; kernel: %s", len(cases), countReqs(cases), inserted, fmtStats(st))
	if st[inject.StatPushFail] != 0 {
		t.Errorf("push_fail = %d: the sk_msg program refused a prepared insertion", st[inject.StatPushFail])
	}
}

func countReqs(cs []connCase) int {
	n := 0
	for _, c := range cs {
		n += len(c.reqs)
	}
	return n
}

func fmtStats(st []uint64) string {
	var parts []string
	for i, name := range inject.StatNames {
		if st[i] != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", name, st[i]))
		}
	}
	return strings.Join(parts, " ")
}

// describe lists a connection's requests and syscalls for a failure message.
func describe(c connCase, vals []string) string {
	var b strings.Builder
	for j, r := range c.reqs {
		line := c.want[r.start:r.lineEnd]
		fmt.Fprintf(&b, "  request %d at %d: %s expect=%v inserted=%v %q\n", j, r.start, r.what, r.expect, vals[j] != "", line[:min(len(line), 30)])
	}
	off := 0
	for _, w := range c.plan.Writes {
		var sizes []string
		for _, x := range w.Bufs {
			sizes = append(sizes, strconv.Itoa(len(x)))
		}
		fmt.Fprintf(&b, "  %s at %d: [%s] %q\n", w.Mode, off, strings.Join(sizes, " "), snippet(w.Bufs[0], 0))
		for _, x := range w.Bufs {
			off += len(x)
		}
	}
	return b.String()
}
