//go:build linux

package e2e

// End-to-end causality: the Gym-shaped stack logs ground truth (launch.py
// --truth), gymtrace traces its three servers, and scoreCausality
// (scorer_test.go) checks every CLIENT span's parent against the inbound
// request whose handler really made the call, for Debian 12's CPython 3.11
// and Debian 13's 3.13 and sid's 3.14 (chroots), python-build-standalone's
// 3.14 (Gym's, through uv; a few cases, on sid's packages), uvicorn h11 and httptools,
// asyncio's loop and uvloop, with and without every agent route behind
// Starlette's BaseHTTPMiddleware, at concurrency 1 to 256, on stacks traced
// from before their first connection (fresh) or attached to while running,
// beside contention (contention_test.go) and with a ring buffer small enough
// to lose records. Every case: 0 wrong parents.
//
//	sudo go test ./test/e2e -run Causality -v -count=1
//
// GYMTRACE_CAUSALITY_SHORT=1 (or -short) leaves out the concurrency-256 runs.

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// causalityStack is one stack configuration; its cases trace it in turn.
type causalityStack struct {
	http, loop, middleware string
	fakebin                bool // fake sandbox CLIs first on the servers' PATH
	reset                  bool // uvicorn --reset-contextvars (a fresh Context() per request; uvicorn >= 0.45: 3.14's)
	// fresh: each case starts a stack of its own with no warm-up and traces
	// it from before its first call, so every connection (the keep-alive
	// pools included) is followed from its first byte, as when gymtrace
	// runs before Gym starts.
	fresh bool
	cases []causalityCase
}

func (sc causalityStack) name() string {
	n := fmt.Sprintf("%s_%s_mw-%s", sc.http, sc.loop, sc.middleware)
	if sc.reset {
		n += "_reset-contextvars"
	}
	if sc.fresh {
		n += "_fresh"
	}
	return n
}

// Small ring buffers, read by a reader that lags on purpose
// (GYMTRACE_TEST_LAGGING_READER: it drains only once the ring has overflowed,
// or the traffic paused), so every collection loses records in bursts all
// through the run. Before, loss depended on the reader falling behind by
// itself: on a quiet machine it kept up with an 8 KiB ring (0 of 2,305
// records lost in one CI run) and the case tested nothing. The assertions
// hold at any loss.
const (
	lossyRing      = "8KiB"
	lossyRingLarge = "4KiB"
	lossyRing64    = "16KiB"
)

// lossyWhole pools the lossy cases' rollouts of one TestCausality run: how
// many, and how many whole, of the cases whose ring refused a share of
// records inside lossBand (its cleanup asserts the share whole), and how
// many rollouts all the lossy cases had.
var lossyWhole tally

// lossBand is issue 37's condition: a ring buffer small enough that 1 to
// 10 % of records are lost. The lagging reader holds the share near 5 %
// (internal/loader lagDue); a case outside (a reader that could not keep
// up even when it did not lag) is reported and left out of the pool.
var lossBand = [2]float64{0.01, 0.10}

type tally struct {
	mu            sync.Mutex
	whole, n, all int // all: the rollouts of every lossy case, pooled or not
}

func (t *tally) reset() { t.mu.Lock(); t.whole, t.n, t.all = 0, 0, 0; t.mu.Unlock() }

func (t *tally) add(whole, n int, pooled bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.all += n
	if pooled {
		t.whole += whole
		t.n += n
	}
}

func (t *tally) get() (whole, n, all int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.whole, t.n, t.all
}

type causalityCase struct {
	groups     string // --span-groups
	c, n       int    // concurrency, rollouts
	collector  []string
	long       bool   // left out by -short / GYMTRACE_CAUSALITY_SHORT
	contention bool   // beside one busy loop per core and a syscall storm (contention_test.go)
	ringbuf    string // --ringbuf-bytes: small enough to lose records (the case asserts it did)
}

func (c causalityCase) name() string {
	s := fmt.Sprintf("%s_c%d_n%d", c.groups, c.c, c.n)
	if len(c.collector) > 0 {
		s += "_" + strings.ReplaceAll(strings.Join(c.collector, ""), "--", "_")
	}
	if c.contention {
		s += "_busy"
	}
	if c.ringbuf != "" {
		s += "_ring" + c.ringbuf
	}
	return s
}

var causalityStacks = []causalityStack{
	{http: "h11", loop: "asyncio", middleware: "responses", cases: []causalityCase{
		{groups: "per_rollout", c: 1, n: 8},
		{groups: "per_rollout", c: 64, n: 64},
		{groups: "default", c: 16, n: 32},
	}},
	{http: "httptools", loop: "asyncio", middleware: "all", cases: []causalityCase{
		{groups: "per_rollout", c: 16, n: 32},
		{groups: "per_rollout", c: 256, n: 256, long: true},
	}},
	// Everything at once: sandbox CLIs spawned from the resources server's
	// request tasks, streamed model answers, /ng-rollout/<id> prefixes and
	// every model route.
	{http: "h11", loop: "asyncio", middleware: "all", fakebin: true, cases: []causalityCase{
		{groups: "all", c: 64, n: 64, collector: []string{"--sandbox", "docker", "--stream", "--prefix", "mixed", "--model-route", "mixed"}},
	}},
	// Gym's runtime: uvloop (0.17 on 3.11, 0.21 on 3.13, 0.23 on 3.14).
	{http: "httptools", loop: "uvloop", middleware: "responses", cases: []causalityCase{
		{groups: "per_rollout", c: 1, n: 8},
		{groups: "per_rollout", c: 16, n: 32},
		{groups: "per_rollout", c: 64, n: 64},
		{groups: "per_rollout", c: 256, n: 256, long: true},
		// Whole conversations: 80-200 KiB bodies both ways, _ng_* keys last.
		{groups: "per_rollout", c: 16, n: 32, collector: []string{"--large-bodies"}},
		// Each connection's first /run head in two reads, its request line
		// alone first (as after injection's pushed line, or from a sender
		// that writes a head in pieces): the handler is still bound.
		{groups: "per_rollout", c: 16, n: 32, collector: []string{"--split-heads", "--loop", "asyncio"}},
	}},
	{http: "h11", loop: "uvloop", middleware: "all", cases: []causalityCase{
		{groups: "per_rollout", c: 16, n: 32},
		{groups: "default", c: 64, n: 64, collector: []string{"--large-bodies"}},
	}},
	{http: "httptools", loop: "asyncio", middleware: "responses", cases: []causalityCase{
		{groups: "per_rollout", c: 16, n: 32, collector: []string{"--large-bodies"}},
	}},
	// uvicorn's opt-in fresh Context() per request (CPython #140947).
	{http: "httptools", loop: "uvloop", middleware: "responses", reset: true, cases: []causalityCase{
		{groups: "per_rollout", c: 16, n: 32},
	}},
	{http: "h11", loop: "asyncio", middleware: "responses", reset: true, cases: []causalityCase{
		{groups: "per_rollout", c: 16, n: 32, collector: []string{"--large-bodies"}},
	}},
	// Traced from the first byte of every connection, several rollouts per
	// connection (n = 4c), as when gymtrace runs before Gym starts; beside
	// contention (busy loops and a syscall storm), and with a ring buffer
	// small enough to lose records (loss asserted, 0 wrong parents, every
	// rollout no loss touched whole; the share whole is reported, and
	// printed in CI: a rollout is some 34 records, so at 1 % uniform loss
	// about 70 % can be; docs/architecture.md, "Loss", has the figures).
	{http: "httptools", loop: "uvloop", middleware: "responses", fresh: true, cases: []causalityCase{
		{groups: "per_rollout", c: 64, n: 256},
		{groups: "per_rollout", c: 64, n: 256, contention: true},
		{groups: "per_rollout", c: 256, n: 256, contention: true, long: true},
		{groups: "per_rollout", c: 16, n: 64, collector: []string{"--large-bodies"}, contention: true},
		{groups: "per_rollout", c: 16, n: 64, collector: []string{"--large-bodies"}, ringbuf: lossyRingLarge},
		{groups: "per_rollout", c: 64, n: 256, ringbuf: lossyRing64},
	}},
	{http: "httptools", loop: "asyncio", middleware: "responses", fresh: true, cases: []causalityCase{
		{groups: "per_rollout", c: 64, n: 256, contention: true},
		{groups: "per_rollout", c: 16, n: 64, collector: []string{"--large-bodies"}, contention: true},
		{groups: "per_rollout", c: 16, n: 64, ringbuf: lossyRing},
		{groups: "per_rollout", c: 64, n: 256, ringbuf: lossyRing64},
	}},
}

func TestCausality(t *testing.T) {
	needStack(t)
	short := testing.Short() || os.Getenv("GYMTRACE_CAUSALITY_SHORT") != ""
	var rows []causalityRow
	lossyWhole.reset()
	t.Cleanup(func() {
		// Issue 37: at least 80 % of rollouts whole under loss. Over every
		// lossy case of the run together: one case's 64 rollouts move by
		// several points between runs (one burst of loss can take the
		// requests of a few rollouts at once), the pool of a CI run's
		// ~2,300 does not.
		whole, n, all := lossyWhole.get()
		if all > 0 {
			figure(t, "lossy cases together: %d of %d rollouts whole (%.1f %%), of the cases whose ring refused 1-10 %% of records (%d rollouts in all lossy cases)",
				whole, n, 100*float64(whole)/float64(max(n, 1)), all)
		}
		// Half the lossy rollouts at least must have had the loss asked
		// for: a pool of one small case would assert nothing.
		if 2*n < all {
			t.Errorf("the rings refused 1-10 %% of records in cases of %d of %d lossy rollouts, want at least half: the loss condition was not made (each case's share is above)", n, all)
		} else if 5*whole < 4*n {
			t.Errorf("with records lost: %d of %d rollouts whole over the lossy cases (%.1f %%), want at least 80 %%",
				whole, n, 100*float64(whole)/float64(n))
		}
		if len(rows) > 0 {
			t.Logf("causality figures (parent accuracy = correct / attributed, coverage = attributed / outbound calls):\n%s",
				causalityTable(rows))
		}
	})
	for _, py := range causalityInterps {
		t.Run(py.testName(), func(t *testing.T) {
			if why := py.skipCheck(); why != "" {
				t.Skip(why)
			}
			var launch []string
			// Compiled fake sandbox CLIs (lifecycle_test.go): the kernel reads
			// the verb from argv, which a #! script's exec rewrites.
			fakes := func(t *testing.T) []string { return []string{"--path-prepend", lcFakeDir(t)} }
			if r := py.root; r != nil {
				dir, err := r.stackDir()
				if err != nil {
					t.Fatal(err)
				}
				launch = []string{"--python", "chroot " + r.root + " " + r.python, "--stack-dir", dir}
				fakes = func(t *testing.T) []string {
					inside := dir + "/gofakes"
					if err := copyTree(lcFakeDir(t), filepath.Join(r.root, inside)); err != nil {
						t.Fatalf("copying the fake sandbox CLIs into the Debian %s root: %v", r.suite, err)
					}
					return []string{"--path-prepend", inside}
				}
			}
			for _, sc := range causalityStacks {
				if !py.runs(sc, "") {
					continue
				}
				t.Run(sc.name(), func(t *testing.T) {
					if sc.reset && (py.root == nil || py.root.root != sid.root) {
						t.Skip("--reset-contextvars needs uvicorn >= 0.45: only the sid root (3.14) has it")
					}
					host, inside := py.truthDir(t)
					truthHost := filepath.Join(host, "truth.jsonl")
					args := append(append([]string{}, launch...), "--http", sc.http, "--loop", sc.loop,
						"--base-middleware", sc.middleware, "--truth", filepath.Join(inside, "truth.jsonl"))
					if sc.fakebin {
						args = append(args, fakes(t)...)
					}
					if sc.reset {
						args = append(args, "--reset-contextvars")
					}
					var st *stack
					if !sc.fresh {
						st = startStack(t, t, args...)
					}
					for _, c := range sc.cases {
						if !py.runs(sc, c.name()) {
							continue
						}
						t.Run(c.name(), func(t *testing.T) {
							if c.long && short {
								t.Skip("concurrency 256 left out by -short / GYMTRACE_CAUSALITY_SHORT")
							}
							row := causalityRow{Python: py.name, HTTP: sc.http, Loop: sc.loop, Middleware: sc.middleware,
								Groups: c.groups, Concurrency: c.c, Rollouts: c.n}
							if sc.reset {
								row.HTTP += " --reset-contextvars"
							}
							if len(c.collector) > 0 {
								row.Groups += " " + strings.Join(c.collector, " ")
							}
							var mk func() *stack
							if sc.fresh {
								mk = func() *stack { return startStack(t, t, append(args, "--warmup", "0")...) }
							}
							row.Score, row.Elapsed = runCausalityCase(t, st, mk, truthHost, c)
							rows = append(rows, row)
						})
					}
				})
			}
		})
	}
}

func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// runCausalityCase attaches gymtrace to the running stack, runs one
// collection, scores the spans against the truth logged since the collection
// started, and checks the score.
// With mk, the case starts a stack of its own (fresh: no connection yet)
// just before gymtrace attaches.
func runCausalityCase(t *testing.T, st *stack, mk func() *stack, truthPath string, c causalityCase) (causalityScore, time.Duration) {
	t.Helper()
	began := time.Now()
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	var extra []string
	if c.ringbuf != "" {
		extra = append(extra, "--ringbuf-bytes", c.ringbuf)
	}
	var load *contention
	if c.contention {
		load = startContention(t)
	}
	if mk != nil {
		st = mk()
	}
	// Debug identities on every span: a finding names the kernel's binding.
	env := []string{"GYMTRACE_DEBUG_RECORDS=1"}
	if c.ringbuf != "" {
		env = append(env, "GYMTRACE_TEST_LAGGING_READER=1")
	}
	gt := startGymtrace(t, gtOpts{pids: st.pids(), groups: c.groups, jsonl: out, extra: extra, env: env})
	// The truth file holds every earlier collection on this stack (the
	// warmup, other cases): only records that start after this point count.
	since := monoNow()
	sum := st.collect(t, c.n, c.c, true, c.collector...)
	m := gt.settle(t, 1)
	if load != nil {
		t.Logf("contention: %s", load.report(t))
	}
	gt.shutdown(t)
	recs, err := waitTruth(truthPath, since, c.n)
	if err != nil {
		t.Fatal(err)
	}
	spans := readSpans(t, out)
	if dir := os.Getenv("GYMTRACE_CAUSALITY_KEEP"); dir != "" {
		keepCausalityFiles(t, dir, out, truthPath, since)
	}
	sc := scoreCausality(recs, spans, st.pids())
	elapsed := time.Since(began)

	t.Logf("%s: %d rollouts ok; outbound %d, correct %d, wrong %d, unattributed %d (%s); accuracy %s, coverage %s; "+
		"sandbox spans %d for %d spawns (right %d, wrong %d, unattributed %d, in several spawns %d); server spans %d/%d, client spans %d/%d, stray %d; rollouts in one trace %d/%d, traces %d, shared %d, /run without span %d, "+
		"rollout ids on %d spans (%d wrong), gym.rollout with the id %d; gymtrace_parent_unresolved_total %s, records lost in the kernel %v; %.1fs",
		c.name(), sum.OK, sc.Outbound, sc.Correct, sc.Wrong, sc.Unattributed, sc.ReasonsString(), pct(sc.Accuracy()), pct(sc.Coverage()),
		sc.SandboxSpans, sc.Spawns, sc.SpawnCorrect, sc.SpawnWrong, sc.SpawnUnattributed, sc.SandboxAmbiguous, sc.ServerSpans, sc.Inbound, sc.ClientSpans, sc.Outbound, sc.StraySpans, sc.RolloutsOneTrace, sc.Rollouts, sc.Traces, sc.SharedTraces,
		sc.RolloutsNoRun, sc.RolloutIDSpans, sc.RolloutIDWrong, sc.GymRolloutSpans,
		labelCounters(m, "gymtrace_parent_unresolved_total", "reason"), m["gymtrace_ringbuf_reserve_failures_total"], elapsed.Seconds())
	if len(sc.Examples) > 0 {
		t.Logf("first findings:\n  %s", strings.Join(sc.Examples, "\n  "))
	}
	if len(sc.WrongExamples) > 0 {
		t.Logf("first wrong parents:\n  %s", strings.Join(sc.WrongExamples, "\n  "))
	}
	t.Logf("kernel asyncio context counters: %s", pyContextCounters(m))
	t.Logf("server joins: %s", labelCounters(m, "gymtrace_server_joins_total", "how"))
	t.Logf("parents resolved: %s", labelCounters(m, "gymtrace_parent_resolved_total", "how"))
	t.Logf("kernel events: %s", labelCounters(m, "gymtrace_kernel_events_total", "reason"))
	kb := scoreKernelBindings(recs, spans)
	t.Logf("kernel bindings of calls to their request: %s", kb)
	if len(kb.Examples) > 0 {
		t.Logf("first wrong kernel bindings:\n  %s", strings.Join(kb.Examples, "\n  "))
	}

	checkCausality(t, c, sc, m, recs, spans, st.pids())
	return sc, elapsed
}

// checkCausality holds one traced collection to the causality assertions:
// every request a span, no wrong parent, every call attributed, one trace
// per rollout, every rollout id its own (with a lossy ring: records lost,
// and no loss making a wrong parent or splitting a rollout it did not
// touch). m is gymtrace's metrics after the collection. TestCausality runs
// it on the host; TestKernelMatrix on what each kernel-matrix guest kept.
func checkCausality(t *testing.T, c causalityCase, sc causalityScore, m map[string]float64, recs []truthRec, spans []Span, pids []int) {
	t.Helper()
	// The truth itself must describe the collection, or the score means nothing.
	if sc.Rollouts != c.n {
		t.Errorf("the truth has %d collector calls of /run since the collection started, want %d", sc.Rollouts, c.n)
	}
	if sc.Outbound == 0 || sc.Inbound == 0 {
		t.Fatalf("the truth has %d outbound and %d inbound records of the traced servers: nothing to score", sc.Outbound, sc.Inbound)
	}
	// Every record the kernel could not write for room: reservations the
	// full ring refused and responses shed while it was crowded
	// (gt_shed_bytes).
	failed := m["gymtrace_ringbuf_reserve_failures_total"]
	if c.ringbuf == "" && failed != 0 {
		t.Errorf("%v records lost in the kernel (ring buffer full or crowded): the score is not about causality", failed)
	}
	// Lost for good: less the request records written late (they
	// arrived: bpf/emit.h gt_emit_late_request).
	late := m[`gymtrace_kernel_events_total{reason="request_late"}`]
	lost := failed - late
	if c.ringbuf != "" {
		// Loss as a test condition: records must have been lost, and no
		// loss may make a wrong parent or split a rollout it did not touch.
		records := m["gymtrace_ringbuf_records_read_total"] + lost
		share := failed / max(records, 1)
		figure(t, "ring buffer %s: %v of %v records refused (%.1f %%), %v lost (%.1f %%, %v of them responses shed; %v request records late); %d rollouts touched by a loss, %d whole of %d (%d more with every request a span, in several traces)",
			c.ringbuf, failed, records, 100*share, lost, 100*lost/max(records, 1), m[`gymtrace_kernel_events_total{reason="response_shed"}`], late,
			sc.RolloutsTouched, sc.RolloutsWhole, sc.Rollouts, sc.RolloutsSpannedSplit)
		if failed == 0 {
			// Refused, whether written late or lost for good: either way
			// the loss path ran.
			t.Errorf("a ring buffer of %s refused no record: the case tests nothing", c.ringbuf)
		}
		if sc.Wrong != 0 || sc.RolloutIDWrong != 0 || sc.SharedTraces != 0 || sc.StraySpans != 0 {
			t.Errorf("with records lost: %d wrong parents, %d wrong rollout ids, %d traces shared by rollouts, %d stray spans; want 0",
				sc.Wrong, sc.RolloutIDWrong, sc.SharedTraces, sc.StraySpans)
		}
		if sc.RolloutsUntouchedSplit != 0 {
			t.Errorf("%d of %d rollouts untouched by a loss are not whole in one trace: want none", sc.RolloutsUntouchedSplit, sc.Rollouts-sc.RolloutsTouched)
		}
		inBand := share >= lossBand[0] && share <= lossBand[1]
		if !inBand {
			figure(t, "ring buffer %s refused %.1f %% of records, outside issue 37's 1-10 %%: its rollouts are not pooled for the share whole", c.ringbuf, 100*share)
		}
		lossyWhole.add(sc.RolloutsWhole, sc.Rollouts, inBand)
		return
	}

	checkScorerCatches(t, recs, spans, pids, sc)

	// A wrong parent is worse than a missing one: none, in any case.
	if sc.Attributed == 0 || sc.Wrong != 0 {
		t.Errorf("%d of %d attributed calls under the wrong inbound request (%d right), want 0",
			sc.Wrong, sc.Attributed, sc.Correct)
	}
	if sc.Unattributed != 0 {
		t.Errorf("%d of %d calls unattributed (%s), want every call under its inbound request",
			sc.Unattributed, sc.Outbound, sc.ReasonsString())
	}
	if sc.ServerSpans != sc.Inbound || sc.ClientSpans != sc.Outbound {
		t.Errorf("not every request has a span: %d/%d inbound requests with a SERVER span, %d/%d outbound calls with a CLIENT span",
			sc.ServerSpans, sc.Inbound, sc.ClientSpans, sc.Outbound)
	}
	if sc.StraySpans != 0 {
		t.Errorf("%d SERVER/CLIENT spans match no request of the truth", sc.StraySpans)
	}
	// One trace per rollout: the collector is not traced, so each /run is a
	// root and everything its handlers caused hangs below it.
	if sc.RolloutsOneTrace != sc.Rollouts || sc.SharedTraces != 0 || sc.Traces != sc.Rollouts {
		t.Errorf("%d of %d rollouts lie in exactly one trace; %d traces in all, %d shared by several rollouts: want one trace per rollout",
			sc.RolloutsOneTrace, sc.Rollouts, sc.Traces, sc.SharedTraces)
	}
	if c.groups == "all" && (sc.Spawns == 0 || sc.SandboxSpans != sc.Spawns || sc.SpawnsCovered != sc.Spawns || sc.SandboxStray != 0 ||
		sc.SpawnWrong != 0 || sc.SpawnCorrect != sc.SandboxSpans) {
		t.Errorf("sandbox CLIs: %d spawned, %d gym.sandbox.* spans (%d spawns contain one, %d spans no spawn contains); "+
			"%d spans under the request that spawned them, %d wrong, %d unattributed",
			sc.Spawns, sc.SandboxSpans, sc.SpawnsCovered, sc.SandboxStray, sc.SpawnCorrect, sc.SpawnWrong, sc.SpawnUnattributed)
	}
	// With large bodies the _ng_* keys come after 80-200 KiB and can be cut
	// by a read boundary: such an id is not found (the kernel never takes a
	// cut value), never wrong. Ids not cut must still be found: at least half.
	large := slices.Contains(c.collector, "--large-bodies")
	if sc.RolloutIDWrong != 0 || (!large && sc.GymRolloutSpans != sc.Rollouts) || (large && 2*sc.GymRolloutSpans < sc.Rollouts) {
		t.Errorf("%d spans carry another rollout's nemo.gym.rollout.id; %d of %d gym.rollout spans carry their own",
			sc.RolloutIDWrong, sc.GymRolloutSpans, sc.Rollouts)
	} else if large && sc.GymRolloutSpans != sc.Rollouts {
		t.Logf("large bodies: %d of %d rollout ids not found (a key cut by a read boundary), none wrong",
			sc.Rollouts-sc.GymRolloutSpans, sc.Rollouts)
	}
}

// waitTruth reads the truth once every process has flushed what it logged
// for the collection: the collector's /run calls are all there and the file
// has stopped growing for longer than the servers' 200 ms flush interval.
func waitTruth(path string, since int64, rollouts int) ([]truthRec, error) {
	deadline := time.Now().Add(30 * time.Second)
	var last []byte
	stable := time.Now()
	for {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("reading the stack's ground truth %s: %w", path, err)
		}
		if !bytes.Equal(data, last) {
			last, stable = data, time.Now()
		}
		if time.Since(stable) >= 500*time.Millisecond {
			recs, err := readTruth(path, since)
			if err != nil {
				return nil, err
			}
			runs := 0
			for _, r := range recs {
				if r.Ev == "out" && r.Cause == "" && r.Path == "/run" {
					runs++
				}
			}
			if runs >= rollouts || time.Now().After(deadline) {
				return recs, nil
			}
		}
		if time.Now().After(deadline) {
			return readTruth(path, since)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkScorerCatches proves on the real spans that the scorer sees a wrong
// parent: k correctly attributed CLIENT spans are moved under the parent of a
// CLIENT span in another trace (another rollout's request) and must score as
// exactly k more wrong.
func checkScorerCatches(t *testing.T, recs []truthRec, spans []Span, pids []int, before causalityScore) {
	t.Helper()
	const k = 5
	if before.Wrong != 0 || before.Correct < 2*k {
		return // not all right, or too few to move: nothing to prove against
	}
	mutated := append([]Span(nil), spans...)
	var clients []int
	for i, s := range mutated {
		if s.Kind == "CLIENT" && s.Parent != "" {
			clients = append(clients, i)
		}
	}
	moved := 0
	for _, i := range clients {
		if moved == k {
			break
		}
		for _, j := range clients {
			if mutated[j].TraceID != mutated[i].TraceID {
				mutated[i].Parent, mutated[i].TraceID = mutated[j].Parent, mutated[j].TraceID
				moved++
				break
			}
		}
	}
	if moved < k {
		return // a single trace (c=1 with one rollout): no other parent to take
	}
	after := scoreCausality(recs, mutated, pids)
	if after.Wrong != k || after.Correct != before.Correct-k {
		t.Errorf("scorer self-check: %d CLIENT spans moved under another rollout's parent scored %d wrong, %d right (was %d right); want %d wrong, %d right",
			k, after.Wrong, after.Correct, before.Correct, k, before.Correct-k)
	}
}

// keepCausalityFiles copies a case's spans and truth window to dir, for
// looking at a failure after the stack is gone.
func keepCausalityFiles(t *testing.T, dir, spans, truth string, since int64) {
	t.Helper()
	base := filepath.Join(dir, strings.ReplaceAll(strings.TrimPrefix(t.Name(), "TestCausality/"), "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("GYMTRACE_CAUSALITY_KEEP: %v", err)
		return
	}
	for src, dst := range map[string]string{spans: base + ".spans.jsonl", truth: base + ".truth.jsonl"} {
		data, err := os.ReadFile(src)
		if err == nil {
			err = os.WriteFile(dst, data, 0o644)
		}
		if err != nil {
			t.Logf("GYMTRACE_CAUSALITY_KEEP: %v", err)
		}
	}
	t.Logf("kept %s.{spans,truth}.jsonl (truth window starts at CLOCK_MONOTONIC %d)", base, since)
}

// pyContextCounters lists gymtrace_python_context_total by event, so that a
// run with missing parents shows which kernel rule bound how many handlers.
func pyContextCounters(m map[string]float64) string {
	return labelCounters(m, "gymtrace_python_context_total", "event")
}

// labelCounters lists one metric family's non-zero series as label=value.
func labelCounters(m map[string]float64, family, label string) string {
	prefix := family + "{" + label + `="`
	var parts []string
	for k, v := range m {
		if strings.HasPrefix(k, prefix) && v != 0 {
			parts = append(parts, fmt.Sprintf("%s=%.0f", strings.TrimSuffix(k[len(prefix):], `"}`), v))
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// figure logs a measured figure and, where GYMTRACE_E2E_FIGURES names a
// file, appends it there with the test's name: scripts/test prints that
// file after the end-to-end tests, so a CI run reports what it measured
// (the share of rollouts whole under loss) without -v.
func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	path := os.Getenv("GYMTRACE_E2E_FIGURES")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("recording a figure: %v", err)
		return
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "%s: %s\n", t.Name(), line); err != nil {
		t.Errorf("recording a figure: %v", err)
	}
}
