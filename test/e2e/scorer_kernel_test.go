//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The kernel's own binding of each outbound call to the inbound request
// whose handler made it (bpf/python.h: the handler task's link names the
// server connection and request index), checked against the truth, with
// gymtrace run under GYMTRACE_DEBUG_RECORDS=1 (internal/spans/debug.go).
// Userspace parents a call only where the bound request's record arrived, so
// a wrong binding can hide behind a lost record; this check sees it anyway,
// and its examples say which identities a wrong parent came from.

// kernelBindings counts the outbound calls whose binding names their cause
// (right), another request (wrong), or a request without a SERVER span
// (unexported, e.g. its record was lost).
type kernelBindings struct {
	Right, Wrong, Unexported, Unbound int
	Examples                          []string
}

func (k kernelBindings) String() string {
	return fmt.Sprintf("right %d, wrong %d, bound to a request without a span %d, unbound %d", k.Right, k.Wrong, k.Unexported, k.Unbound)
}

// debugAttrs is the kernel identities of a span, for a finding.
func debugAttrs(s Span) string {
	var parts []string
	for _, k := range []string{"conn", "seq", "tid", "py_ctx", "py_root", "cause_conn", "cause_seq", "req_start", "gap"} {
		if v, ok := s.Attributes["gymtrace.debug."+k]; ok {
			parts = append(parts, k+"="+anyString(v))
		}
	}
	return strings.Join(parts, " ")
}

// truthAt picks, among records of one connection, the one a span's kernel
// start belongs to, by kernelCost's rule: for a call, the newest that began
// before its write and had not ended (the app stamps its truth first); for a
// request, the first that began after its read (the handler stamps it after).
func truthAt(recs []truthRec, mono int64, before bool, path string) (truthRec, bool) {
	best, found := truthRec{}, false
	var bestC int64
	for _, r := range recs {
		if !samePath(r.Path, path) || r.MonoStart == 0 {
			continue
		}
		if c, ok := monoCost(r, mono, before); ok && (!found || c < bestC) {
			best, bestC, found = r, c, true
		}
	}
	return best, found
}

func scoreKernelBindings(recs []truthRec, spans []Span) kernelBindings {
	ins, outs := map[joinKey][]truthRec{}, map[joinKey][]truthRec{}
	for _, r := range recs {
		switch {
		case r.Ev == "in" && r.Peer.Port != 0:
			k := joinKey{r.PID, r.Peer.Port, r.Local.Port}
			ins[k] = append(ins[k], r)
		case r.Ev == "out" && r.Local.Port != 0 && r.Cause != "":
			k := joinKey{r.PID, r.Local.Port, r.Remote.Port}
			outs[k] = append(outs[k], r)
		}
	}
	type req struct {
		pid       int
		conn, seq int
	}
	servers := map[req]Span{}
	for _, s := range spans {
		if s.Kind == "SERVER" && s.Attributes["gymtrace.debug.conn"] != nil {
			servers[req{s.PID(), s.AttrInt("gymtrace.debug.conn"), s.AttrInt("gymtrace.debug.seq")}] = s
		}
	}
	var k kernelBindings
	for _, s := range spans {
		if s.Kind != "CLIENT" || s.Attributes["gymtrace.debug.cause_conn"] == nil {
			continue
		}
		o, ok := truthAt(outs[joinKey{s.PID(), s.AttrInt("network.local.port"), s.AttrInt("server.port")}],
			int64(anyInt(s.Attributes["gymtrace.debug.req_start"])), true, s.Path())
		if !ok {
			continue // not a call with a cause (the collector's)
		}
		cc := s.AttrInt("gymtrace.debug.cause_conn")
		if cc == 0 {
			k.Unbound++
			continue
		}
		srv, ok := servers[req{s.PID(), cc, s.AttrInt("gymtrace.debug.cause_seq")}]
		if !ok {
			k.Unexported++
			continue
		}
		in, ok := truthAt(ins[joinKey{s.PID(), srv.AttrInt("client.port"), srv.AttrInt("server.port")}],
			int64(anyInt(srv.Attributes["gymtrace.debug.req_start"])), false, srv.Path())
		if ok && in.ID == o.Cause {
			k.Right++
			continue
		}
		k.Wrong++
		if len(k.Examples) < 8 {
			k.Examples = append(k.Examples, fmt.Sprintf("%s %s (cause %s; %s) bound to %s %s (%s)",
				o.ID, o.Path, o.Cause, debugAttrs(s), in.ID, in.Path, debugAttrs(srv)))
		}
	}
	sort.Strings(k.Examples)
	return k
}

// TestCausalityKept re-scores the runs GYMTRACE_CAUSALITY_KEEP kept, from
// GYMTRACE_SCORE_DIR: the scorer's figures and findings, and the kernel's
// bindings.
func TestCausalityKept(t *testing.T) {
	dir := os.Getenv("GYMTRACE_SCORE_DIR")
	if dir == "" {
		t.Skip("GYMTRACE_SCORE_DIR is not set: nothing kept to score")
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.spans.jsonl"))
	if len(files) == 0 {
		t.Fatalf("no *.spans.jsonl in %s", dir)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".spans.jsonl"), func(t *testing.T) {
			spans := readSpans(t, f)
			recs, err := readTruth(strings.TrimSuffix(f, ".spans.jsonl")+".truth.jsonl", 0)
			if err != nil {
				t.Fatal(err)
			}
			pids := map[int]bool{}
			for _, s := range spans {
				pids[s.PID()] = true
			}
			var traced []int
			for p := range pids {
				traced = append(traced, p)
			}
			sc := scoreCausality(recs, spans, traced)
			kb := scoreKernelBindings(recs, spans)
			t.Logf("outbound %d, correct %d, wrong %d, unattributed %d; kernel bindings: %s; rollouts in one trace %d/%d, shared traces %d",
				sc.Outbound, sc.Correct, sc.Wrong, sc.Unattributed, kb, sc.RolloutsOneTrace, sc.Rollouts, sc.SharedTraces)
			for _, e := range append(sc.WrongExamples, kb.Examples...) {
				t.Log(e)
			}
		})
	}
}
