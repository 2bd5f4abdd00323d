//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestKernelMatrix judges what scripts/kernel-matrix-guest kept on each
// kernel (scripts/kernel-matrix runs it after the guests, the host's own
// kernel included): the causality of each collection, with TestCausality's
// assertions; every program of every build the kernel loaded within the
// verifier margins; and the feature table, asserted: a feature that is off
// fails unless it is expected off on that kernel, and one expected off that
// is on fails too (the expectation is stale). It writes the tables
// (features.md, causality.md) into the directory for docs/kernels.md.
//
//	GYMTRACE_KMATRIX_OUT=/var/tmp/gymtrace-kmatrix/out GYMTRACE_KMATRIX_SUITES="bookworm trixie sid host" \
//	  go test ./test/e2e -run 'TestKernelMatrix$' -v
func TestKernelMatrix(t *testing.T) {
	dir := os.Getenv("GYMTRACE_KMATRIX_OUT")
	if dir == "" {
		t.Skip("GYMTRACE_KMATRIX_OUT not set: scripts/kernel-matrix runs this on what its guests kept")
	}
	suites := strings.Fields(os.Getenv("GYMTRACE_KMATRIX_SUITES"))
	if len(suites) == 0 {
		t.Fatal("GYMTRACE_KMATRIX_SUITES names no suite")
	}
	var kernels []kmKernel
	var caus []string
	for _, s := range suites {
		k := kmKernel{Suite: s, Features: map[string]kmFeature{}}
		t.Run(s, func(t *testing.T) { kmJudge(t, filepath.Join(dir, s), &k, &caus) })
		kernels = append(kernels, k)
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Error(err)
		}
	}
	ft := kmFeatureTable(kernels)
	t.Logf("features:\n%s", ft)
	write("features.md", ft)
	ct := "| kernel | Python | loop | requests with a span | parents right / wrong / unattributed | rollouts whole | collection |\n" +
		"| --- | --- | --- | --- | --- | --- | --- |\n" + strings.Join(caus, "")
	t.Logf("causality:\n%s", ct)
	write("causality.md", ct)
}

// The features of the table, in its order.
var kmFeatureNames = []string{"groups gate", "capture", "joins", "asyncio parents", "uvloop parents",
	"rollout ids", "reward", "TLS", "lifecycle", "injection", kmTwoNodeFeature}

type kmFeature struct {
	On       bool
	Evidence string // what was measured
	Expected string // why it is expected off here ("" when expected on)
	NotRun   string // why this run did not measure it here (the job was not asked to)
}

type kmKernel struct {
	Suite, Release string
	Build          string // the build check loaded
	Verified       int    // the most instructions a program of it verified
	Stack          int    // its deepest combined stack
	Features       map[string]kmFeature
}

var kmCheckRe = regexp.MustCompile(`(?m)^BPF programs \((\w+) build\)\s+(\w+)\s.*: at most (\d+) instructions verified \((\w+),.* at most (\d+) bytes of stack \((\w+)\)`)

// kmCheckMargins holds the build `gymtrace check` loaded (every program of
// the build this kernel gets) to half the verifier's instruction limit and
// 448 bytes of stack: check reports the most of each.
func kmCheckMargins(t *testing.T, check string, k *kmKernel) {
	m := kmCheckRe.FindStringSubmatch(check)
	if m == nil {
		t.Errorf("check.txt has no BPF programs line with the verifier's figures:\n%s", check)
		return
	}
	k.Build = m[1]
	k.Verified, _ = strconv.Atoi(m[3])
	k.Stack, _ = strconv.Atoi(m[5])
	if m[2] != "ok" {
		t.Errorf("gymtrace check: BPF programs (%s build) %s", m[1], m[2])
	}
	if k.Verified > 500_000 || k.Stack > 448 {
		t.Errorf("%s build: %s verified %d instructions, %s has %d bytes of stack: past the margin (500,000; 448 B)", m[1], m[4], k.Verified, m[6], k.Stack)
	}
	t.Logf("%s build (check): at most %d instructions verified (%s), %d bytes of stack (%s)", m[1], k.Verified, m[4], k.Stack, m[6])
}

var kmReleaseRe = regexp.MustCompile(`(?m)^kernel\s+ok\s+required\s+Linux (\S+)`)

func kmJudge(t *testing.T, dir string, k *kmKernel, caus *[]string) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("%s: %v (did the job run?)", name, err)
		}
		return string(b)
	}
	check := read("check.txt")
	if m := kmReleaseRe.FindStringSubmatch(check); m != nil {
		k.Release = m[1]
	}
	kmCheckMargins(t, check, k)
	if b, err := os.ReadFile(filepath.Join(dir, "load.json")); err == nil {
		kmMargins(t, string(b))
	}
	phases, asked := kmAsked(t, dir)
	kmTwoNode(t, dir, phases, check, k.Release, k) // asserted there, its own phase
	if !slices.Contains(phases, "trace") {
		why := fmt.Sprintf("no traced run here (phases %s)", strings.Join(phases, ","))
		for _, f := range kmFeatureNames {
			if f != kmTwoNodeFeature {
				k.Features[f] = kmFeature{NotRun: why}
			}
		}
		t.Logf("features not measured: %s", why)
		return
	}

	tr := filepath.Join(dir, "trace")
	spans := readSpans(t, filepath.Join(tr, "spans.jsonl"))
	metricsAt := func(phase string) map[string]float64 {
		return parseMetrics(strings.NewReader(read(filepath.Join("trace", "metrics-"+phase+".txt"))))
	}
	final := metricsAt("final")
	paths := map[string]int{}
	for _, s := range spans {
		if p := s.Path(); strings.HasPrefix(p, "/km-") {
			paths[strings.SplitN(p[1:], "/", 2)[0]]++
		}
	}
	set := func(name string, on bool, format string, args ...any) {
		k.Features[name] = kmFeature{On: on, Evidence: fmt.Sprintf(format, args...)}
	}
	rec := "gymtrace_ringbuf_records_read_total"
	plainRecs := metricsAt("plain")[rec] - metricsAt("attached")[rec]
	set("capture", paths["km-plain"] == 10, "%d of 10 requests to a plain HTTP server made a span", paths["km-plain"])
	set("lifecycle", paths["km-fork"] == 10, "%d of 10 requests answered by forked children made a span", paths["km-fork"])
	tlsEv := final[`gymtrace_kernel_events_total{reason="tls_events"}`]
	set("TLS", paths["km-tls"] == 10 && tlsEv > 0, "%d of 10 HTTPS requests made a span (%.0f records from TLS plaintext)", paths["km-tls"], tlsEv)
	gated := metricsAt("gate-after")[rec] - metricsAt("gate-before")[rec]
	set("groups gate", paths["km-gate"] == 0 && paths["km-sentinel"] == 1 && plainRecs > 0 && 2*gated < plainRecs,
		"server off: %d spans and %.0f records for 10 requests and 1 after it was back on (10 with it on: %.0f records)",
		paths["km-gate"], gated, plainRecs)
	rw := final[`gymtrace_kernel_events_total{reason="reward_found"}`]
	set("reward", rw > 0, "%.0f rewards read in the kernel (%.0f missed)", rw, final[`gymtrace_kernel_events_total{reason="reward_missed"}`])
	inj := final[`gymtrace_kernel_events_total{reason="inject_injected"}`]
	set("injection", final[`gymtrace_inject_enabled{reason=""}`] == 1 && inj > 0, "%.0f traceparents injected (%s)", inj, kmInjectState(final))

	// The collections.
	var joins, ids, rollouts float64
	parents := map[string][2]int{} // loop -> right, cases
	cases, _ := filepath.Glob(filepath.Join(tr, "3.*-*"))
	if len(cases) == 0 {
		t.Errorf("no collection in %s", tr)
	}
	for _, a := range asked {
		if _, err := os.Stat(filepath.Join(tr, strings.ReplaceAll(a, "/", "-"))); err != nil {
			t.Errorf("case %s was asked for and has no collection: %v", a, err)
		}
	}
	for _, cd := range cases {
		name := filepath.Base(cd)
		py, loop, _ := strings.Cut(name, "-")
		t.Run(name, func(t *testing.T) {
			rd := func(f string) string { return strings.TrimSpace(read(filepath.Join("trace", name, f))) }
			var c causalityCase
			if _, err := fmt.Sscanf(rd("cn"), "%d %d", &c.c, &c.n); err != nil {
				t.Fatalf("cn: %v", err)
			}
			c.groups = "per_rollout"
			since, err := strconv.ParseInt(rd("since"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			var pids []int
			for _, p := range strings.Split(rd("pids"), ",") {
				n, err := strconv.Atoi(p)
				if err != nil {
					t.Fatal(err)
				}
				pids = append(pids, n)
			}
			recs, err := readTruth(filepath.Join(cd, "truth.jsonl"), since)
			if err != nil {
				t.Fatal(err)
			}
			var own []Span
			for _, s := range spans {
				if slices.Contains(pids, s.PID()) {
					own = append(own, s)
				}
			}
			sc := scoreCausality(recs, own, pids)
			m := metricsAt(name)
			t.Logf("%s %s: outbound %d, client spans %d, correct %d, wrong %d, unattributed %d (%s); server spans %d/%d, stray %d; "+
				"rollouts %d, in one trace %d, whole %d; traces %d, shared %d; gym.rollout with its id %d, ids wrong %d; %s",
				k.Suite, name, sc.Outbound, sc.ClientSpans, sc.Correct, sc.Wrong, sc.Unattributed, sc.ReasonsString(), sc.ServerSpans, sc.Inbound,
				sc.StraySpans, sc.Rollouts, sc.RolloutsOneTrace, sc.RolloutsWhole, sc.Traces, sc.SharedTraces, sc.GymRolloutSpans, sc.RolloutIDWrong,
				kmSkipped(m))
			if len(sc.Examples) > 0 {
				t.Logf("first findings:\n  %s", strings.Join(sc.Examples, "\n  "))
			}
			if len(sc.WrongExamples) > 0 {
				t.Logf("first wrong parents:\n  %s", strings.Join(sc.WrongExamples, "\n  "))
			}
			skipped := m[`gymtrace_kernel_events_total{reason="program_skipped"}`]
			switch {
			case kmPythonOff(check):
				kmCheckUnparented(t, sc)
			case skipped > 0:
				kmCheckSkipped(t, sc, skipped, kmPreempt(dir))
			default:
				checkCausality(t, c, sc, m, recs, own, pids)
			}
			if t.Failed() && skipped > 0 {
				t.Errorf("known cause: the kernel skipped %.0f runs of the syscall programs so far (recursion misses; preemption %s): "+
					"docs/architecture.md, \"Still open: a kernel that preempts BPF programs\"", skipped, kmPreempt(dir))
			}
			p := parents[loop]
			p[1]++
			if sc.Correct > 0 {
				p[0]++
			}
			parents[loop] = p
			joins += float64(sc.RolloutsOneTrace)
			ids += float64(sc.GymRolloutSpans)
			rollouts += float64(sc.Rollouts)
			verdict := ""
			if t.Failed() {
				verdict = " **failed**"
			} else if skipped > 0 && !kmPythonOff(check) {
				verdict = fmt.Sprintf(" (the kernel skipped %.0f syscall program runs: %d rollouts touched by an unseen event, the others asserted whole)", skipped, sc.RolloutsTouched)
			}
			*caus = append(*caus, fmt.Sprintf("| %s | %s | %s | %d/%d server, %d/%d client | %d / %d / %d | %d of %d%s | %s |\n",
				kmName(k), py, loop, sc.ServerSpans, sc.Inbound, sc.ClientSpans, sc.Outbound, sc.Correct, sc.Wrong, sc.Unattributed,
				sc.RolloutsWhole, sc.Rollouts, verdict, rd("took")))
		})
	}
	var sj float64
	for key, v := range final {
		if strings.HasPrefix(key, "gymtrace_server_joins_total{") && !strings.Contains(key, "wait_expired") && !strings.Contains(key, "unprovable") {
			sj += v
		}
	}
	set("joins", joins > 0 && sj > 0, "%.0f of %.0f rollouts in one trace across the three servers; %.0f server spans joined to their caller", joins, rollouts, sj)
	set("rollout ids", ids > 0, "%.0f of %.0f gym.rollout spans carry their rollout's id", ids, rollouts)
	for _, loop := range []string{"asyncio", "uvloop"} {
		p := parents[loop]
		if p[1] == 0 {
			k.Features[loop+" parents"] = kmFeature{NotRun: fmt.Sprintf("no collection on %s here (cases %s)", loop, strings.Join(asked, ","))}
			continue
		}
		set(loop+" parents", p[0] == p[1], "%d of %d collections on %s with calls under their request (right/wrong above)", p[0], p[1], loop)
	}

	// What is expected off here, and why.
	expect := map[string]string{}
	if strings.Contains(check, "program gt_inject_sockops") && strings.Contains(check, "lacks bpf_get_current_pid_tgid in sock_ops") {
		if kmBefore(k.Release, 6, 10) {
			expect["injection"] = "needs Linux 6.10 (bpf_get_current_pid_tgid in sock_ops; the program is left out)"
		} else {
			t.Errorf("check left injection out on Linux %s, which has what it needs (6.10+)", k.Release)
		}
	}
	// What check names off (the k510 build on 5.10: internal/loader
	// variant.go), each the feature the table measures.
	if kmPythonOff(check) {
		why := "no uprobe attach cookies (Linux 5.15): the Python probes are left out, calls unparented"
		expect["asyncio parents"], expect["uvloop parents"] = why, why
		expect["joins"] = "rollouts in one trace need asyncio parents (off here); server spans still join their callers"
	}
	if strings.Contains(check, "HTTPS (OpenSSL probes) is off") {
		expect["TLS"] = "the TLS programs are left out of the k510 build"
	}
	if regexp.MustCompile(`(?m)^/verify rewards\s+missing`).MatchString(check) {
		expect["reward"] = "the k510 build has no body walk for it (no bpf_loop before Linux 5.17)"
	}
	if regexp.MustCompile(`(?m)^injection self-test \(sockhash\)\s+missing .*FIONREAD`).MatchString(check) {
		expect["injection"] = "the kernel misreports FIONREAD in a sockhash (its self-test keeps injection off)"
	}
	for _, f := range kmFeatureNames {
		ft, ok := k.Features[f]
		if f == kmTwoNodeFeature {
			continue // judged by kmTwoNode
		}
		if !ok {
			t.Errorf("feature %s: not measured", f)
			continue
		}
		ft.Expected = expect[f]
		k.Features[f] = ft
		switch {
		case ft.NotRun != "" && ft.Expected != "":
			t.Logf("feature %s: off, as check names it here: %s (and not run: %s)", f, ft.Expected, ft.NotRun)
		case ft.NotRun != "":
			t.Logf("feature %s: not run: %s", f, ft.NotRun)
		case ft.On && ft.Expected != "":
			t.Errorf("feature %s is on, but expected off here (%s): %s; the expectation is stale", f, ft.Expected, ft.Evidence)
		case !ft.On && ft.Expected == "":
			t.Errorf("feature %s is off: %s", f, ft.Evidence)
		case !ft.On:
			t.Logf("feature %s: off, as expected here: %s (%s)", f, ft.Expected, ft.Evidence)
		default:
			t.Logf("feature %s: on: %s", f, ft.Evidence)
		}
	}
}

// kmMargins holds every program of every build the kernel loaded to half
// the verifier's instruction limit and 448 bytes of stack.
func kmMargins(t *testing.T, loadJSON string) {
	var run struct {
		Kernel   string
		Picked   string
		Variants []struct {
			Name     string
			Programs []struct {
				Name            string
				Verified, Stack int
				Refusal, Error  string
			}
		}
	}
	if err := json.Unmarshal([]byte(loadJSON), &run); err != nil {
		t.Fatalf("load.json: %v", err)
	}
	for _, v := range run.Variants {
		maxV, maxS, loaded := 0, 0, 0
		for _, p := range v.Programs {
			if p.Refusal != "" || p.Error != "" {
				if v.Name == run.Picked {
					t.Errorf("%s build (this kernel's): %s refused: %s%s", v.Name, p.Name, p.Refusal, p.Error)
				}
				continue
			}
			loaded++
			if p.Verified > 500_000 || p.Stack > 448 {
				t.Errorf("%s build: %s verified %d instructions with %d bytes of stack: past the margin (500,000; 448 B)", v.Name, p.Name, p.Verified, p.Stack)
			}
			maxV, maxS = max(maxV, p.Verified), max(maxS, p.Stack)
		}
		t.Logf("%s build: %d programs loaded, at most %d instructions verified, %d bytes of stack", v.Name, loaded, maxV, maxS)
	}
}

// kmAsked is what the job was asked to run (its file asked: "phases P,Q"
// and "cases 3.11/uvloop,..."); a run from before that file: every phase
// whose results are there, and the cases it kept.
func kmAsked(t *testing.T, dir string) (phases, cases []string) {
	b, err := os.ReadFile(filepath.Join(dir, "asked"))
	if err != nil {
		if _, err := os.Stat(filepath.Join(dir, "trace", "metrics-final.txt")); err == nil {
			phases = append(phases, "trace")
		}
		return append(phases, "check"), nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		key, val, _ := strings.Cut(line, " ")
		var list []string
		for _, v := range strings.Split(val, ",") {
			if v = strings.TrimSpace(v); v != "" {
				list = append(list, v)
			}
		}
		switch key {
		case "phases":
			phases = list
		case "cases":
			cases = list
		}
	}
	if len(phases) == 0 {
		t.Errorf("asked names no phase: %q", b)
	}
	return phases, cases
}

// kmPreempt is the kernel's preemption model, as the job's first line says.
func kmPreempt(dir string) string {
	b, _ := os.ReadFile(filepath.Join(dir, "console.log"))
	if m := regexp.MustCompile(`preempt=(\S*)`).FindSubmatch(b); m != nil && len(m[1]) > 0 {
		return string(m[1])
	}
	return "not known"
}

func kmInjectState(m map[string]float64) string {
	for k, v := range m {
		if strings.HasPrefix(k, "gymtrace_inject_enabled{") {
			return fmt.Sprintf("%s %.0f", strings.TrimPrefix(k, "gymtrace_"), v)
		}
	}
	return "no gymtrace_inject_enabled"
}

func kmSkipped(m map[string]float64) string {
	return fmt.Sprintf("so far: program_skipped %.0f, parse_error %.0f, records lost in the kernel %.0f",
		m[`gymtrace_kernel_events_total{reason="program_skipped"}`], m[`gymtrace_kernel_events_total{reason="parse_error"}`],
		m["gymtrace_ringbuf_reserve_failures_total"])
}

// kmBefore: release (6.1.0-57-amd64) is older than major.minor.
func kmBefore(release string, major, minor int) bool {
	var a, b int
	if _, err := fmt.Sscanf(release, "%d.%d", &a, &b); err != nil {
		return false
	}
	return a < major || (a == major && b < minor)
}

func kmName(k *kmKernel) string {
	if k.Suite == "host" {
		return k.Release + " (host)"
	}
	return k.Release
}

func kmFeatureTable(ks []kmKernel) string {
	var b bytes.Buffer
	b.WriteString("| feature |")
	for i := range ks {
		fmt.Fprintf(&b, " %s |", kmName(&ks[i]))
	}
	b.WriteString("\n| --- |" + strings.Repeat(" --- |", len(ks)) + "\n")
	b.WriteString("| build, most verified instructions, deepest stack |")
	for _, k := range ks {
		fmt.Fprintf(&b, " %s, %d (%.1f %%), %d B |", k.Build, k.Verified, float64(k.Verified)/10_000, k.Stack)
	}
	b.WriteString("\n")
	for _, f := range kmFeatureNames {
		fmt.Fprintf(&b, "| %s |", f)
		for _, k := range ks {
			ft, ok := k.Features[f]
			switch {
			case !ok:
				b.WriteString(" not measured |")
			case ft.NotRun != "" && ft.Expected != "":
				fmt.Fprintf(&b, " off, as expected: %s |", ft.Expected)
			case ft.NotRun != "":
				fmt.Fprintf(&b, " not run: %s |", ft.NotRun)
			case ft.On && ft.Expected == "":
				b.WriteString(" yes |")
			case !ft.On && ft.Expected != "":
				fmt.Fprintf(&b, " off, as expected: %s |", ft.Expected)
			case ft.On:
				b.WriteString(" **yes, expected off** |")
			default:
				fmt.Fprintf(&b, " **no**: %s |", ft.Evidence)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// kmPythonOff: check left the Python probes out (no attach cookies, the k510
// build on 5.10), so client calls have no asyncio parents there.
func kmPythonOff(check string) bool {
	return strings.Contains(check, "asyncio parents (Python and uvloop probes) is off")
}

// kmCheckSkipped holds a collection during which the kernel skipped runs
// of the syscall programs' understudies (or, where it attaches none, of the
// programs themselves; gymtrace_kernel_events_total{reason="program_skipped"},
// from their recursion misses: sid's PREEMPT_LAZY 7.2 skips a program while
// one of its runs is stopped on the CPU, docs/architecture.md "A kernel that
// preempts BPF programs") to what gymtrace promises where it may not have
// seen everything, as the causality tests' lossy ring buffer: no wrong
// parent, no stray span, no trace shared by two rollouts, no wrong rollout
// id, and every rollout that no unseen event touched (each of its requests
// a span, none marked as cut by a loss) whole in one trace. A skipped
// understudy loses nothing where its program ran, so most such collections
// are whole; how many rollouts were touched is reported.
func kmCheckSkipped(t *testing.T, sc causalityScore, skipped float64, preempt string) {
	t.Helper()
	if sc.Wrong != 0 || sc.StraySpans != 0 || sc.SharedTraces != 0 || sc.RolloutIDWrong != 0 {
		t.Errorf("with %.0f syscall program runs skipped by the kernel: %d wrong parents, %d stray spans, %d traces shared by rollouts, %d wrong rollout ids; want 0",
			skipped, sc.Wrong, sc.StraySpans, sc.SharedTraces, sc.RolloutIDWrong)
	}
	if sc.RolloutsUntouchedSplit != 0 {
		t.Errorf("with %.0f syscall program runs skipped by the kernel: %d of %d rollouts no unseen event touched are not whole in one trace; want none",
			skipped, sc.RolloutsUntouchedSplit, sc.Rollouts-sc.RolloutsTouched)
	}
	t.Logf("the kernel (preemption %s) skipped %.0f syscall program runs: %d/%d server and %d/%d client requests with a span, %d of %d rollouts whole, %d touched by an unseen event, %d calls unattributed; none wrong",
		preempt, skipped, sc.ServerSpans, sc.Inbound, sc.ClientSpans, sc.Outbound, sc.RolloutsWhole, sc.Rollouts, sc.RolloutsTouched, sc.Unattributed)
}

// kmCheckUnparented holds a collection made without asyncio parents to what
// it must still give: every request a span, and no call a wrong parent (a
// call is unparented where its parent cannot be known), no stray span, no
// trace shared by two rollouts, no wrong rollout id.
func kmCheckUnparented(t *testing.T, sc causalityScore) {
	t.Helper()
	if sc.ServerSpans != sc.Inbound || sc.ClientSpans != sc.Outbound {
		t.Errorf("requests without a span: %d/%d server, %d/%d client", sc.ServerSpans, sc.Inbound, sc.ClientSpans, sc.Outbound)
	}
	if sc.Wrong != 0 || sc.StraySpans != 0 || sc.SharedTraces != 0 || sc.RolloutIDWrong != 0 {
		t.Errorf("without asyncio parents: %d wrong parents, %d stray spans, %d traces shared by rollouts, %d wrong rollout ids; want 0",
			sc.Wrong, sc.StraySpans, sc.SharedTraces, sc.RolloutIDWrong)
	}
	t.Logf("without asyncio parents: %d of %d calls unparented, none wrong", sc.Unattributed, sc.Outbound)
}
