package python

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	pytestbpf "github.com/gymtrace/gymtrace/internal/python/pytest_bpf"
	"github.com/gymtrace/gymtrace/test/testproc"
)

var freePort = testproc.FreePort

// waitPort waits until something listens on port, and fails at once if the
// process that should listen there (done closed) has exited.
func waitPort(t *testing.T, port int, done <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			t.Fatalf("the server for port %d exited before listening (its output is above)", port)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("nothing listening on port %d after 30 s", port)
}

// startBackground starts cmd with its output on the test's stderr and
// returns a channel closed when it exits. The test's cleanup kills it.
func startBackground(t *testing.T, cmd *exec.Cmd) <-chan struct{} {
	t.Helper()
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %v: %v", cmd.Args, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	return done
}

var (
	outboundRE = regexp.MustCompile(`^(GET|POST) /up/(r\d+)/(\w+) `)
	ridRE      = regexp.MustCompile(`(?i)x-rid: (r\d+)\r\n`)
)

type stackResult struct {
	requests, outbound, correct, wrong, unknown, noRoot int
	links                                               uint64
}

// runStack runs causality_app.py (upstream, app, load) on one interpreter
// with the kernel side on the app, and scores every outbound request's root
// against the root of the response that carries its inbound request's id.
func runStack(t *testing.T, which string, n, c int, appArgs ...string) stackResult {
	return runStackProbes(t, which, n, c, false, appArgs...)
}

// runStackProbes is runStack with the link probes at the call sites
// (AttachSiteProbes) when sites is set; a build they cannot cover fails.
func runStackProbes(t *testing.T, which string, n, c int, sites bool, appArgs ...string) stackResult {
	objs := loadTestObjects(t)
	attachTP(t, "sys_enter_sendto", objs.PytestSendto)
	attachTP(t, "sys_enter_write", objs.PytestWrite)
	attachTP(t, "sys_enter_recvfrom", objs.PytestRecvEnter)
	attachTP(t, "sys_exit_recvfrom", objs.PytestRecvExit)
	script := testdataScript(t, "causality_app.py")
	up, app := freePort(t), freePort(t)
	ports := []string{"--port", fmt.Sprint(app), "--upstream-port", fmt.Sprint(up)}
	upDone := startBackground(t, pyCmd(t, which, script, append([]string{"upstream"}, ports...)...))
	appCmd := pyCmd(t, which, script, append(append([]string{"app"}, ports...), appArgs...)...)
	appDone := startBackground(t, appCmd)
	waitPort(t, up, upDone)
	waitPort(t, app, appDone)
	in, err := InspectInterpreter(appCmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := objs.GtPyProcs.Put(uint32(in.PID), in.Params); err != nil {
		t.Fatal(err)
	}
	var probes io.Closer
	if sites {
		probes, _, err = in.AttachSiteProbes(objs.GtPyCopySite, objs.GtPyCopyRet)
	} else {
		probes, err = in.AttachProbes(objs.GtPyCopyRet)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer probes.Close()
	rd, err := ringbuf.NewReader(objs.PytestEvents)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()

	type rec struct {
		ctx, root CtxID
		chain     [6]uint64
		croot     [6]uint64
		data      string
	}
	recs := make(chan rec, 1<<16)
	go func() {
		for {
			// Until the Flush below: every record the run made is in
			// the ring by then (its syscalls have returned).
			r, err := rd.Read()
			if err != nil {
				close(recs)
				return
			}
			var e pytestbpf.Event
			if binary.Read(bytes.NewReader(r.RawSample), binary.LittleEndian, &e) != nil || int(e.Tgid) != in.PID {
				continue
			}
			recs <- rec{chain: e.Chain, croot: e.ChainRoot, ctx: CtxID(e.Ctx), root: CtxID(e.Root), data: string(e.Data[:min(int(e.Len), len(e.Data))])}
		}
	}()

	linksBefore := statSum(t, objs, StatLinked)
	load := pyCmd(t, which, script, append([]string{"load", "-n", fmt.Sprint(n), "-c", fmt.Sprint(c)}, ports...)...)
	if out, err := load.CombinedOutput(); err != nil {
		t.Fatalf("load: %v: %s", err, out)
	}
	res := stackResult{requests: n, links: statSum(t, objs, StatLinked) - linksBefore}
	// Read what the ring holds, then stop: not a wait for the reader to
	// catch up, which a busy machine can outlast.
	if err := rd.Flush(); err != nil {
		t.Fatal(err)
	}

	respRoot := map[string]CtxID{}
	type out struct {
		rid, how  string
		ctx, root CtxID
		chain     [6]uint64
		croot     [6]uint64
	}
	var outs []out
	for r := range recs {
		if m := outboundRE.FindStringSubmatch(r.data); m != nil {
			outs = append(outs, out{rid: m[2], how: m[3], ctx: r.ctx, root: r.root, chain: r.chain, croot: r.croot})
			continue
		}
		if strings.HasPrefix(r.data, "HTTP/1.1 200") {
			if m := ridRE.FindStringSubmatch(r.data); m != nil {
				respRoot[m[1]] = r.root
				if os.Getenv("GYMTRACE_DEBUG") != "" {
					t.Logf("response %s ctx %s root %s chain %s roots %s", m[1], r.ctx, r.root, chainString(r.chain), chainString(r.croot))
				}
			}
		}
	}
	ridOfRoot := map[CtxID]string{}
	for rid, root := range respRoot {
		if root == 0 {
			continue
		}
		if other, dup := ridOfRoot[root]; dup {
			t.Errorf("requests %s and %s share root %s", rid, other, root)
		}
		ridOfRoot[root] = rid
	}
	byHow := map[string][2]int{}
	for _, o := range outs {
		res.outbound++
		h := byHow[o.how]
		switch owner, ok := ridOfRoot[o.root]; {
		case o.root == 0:
			res.noRoot++
		case !ok:
			res.unknown++
		case owner == o.rid:
			res.correct++
			h[0]++
		default:
			res.wrong++
			t.Errorf("outbound %s/%s (ctx %s root %s chain %s roots %s) attributed to %s", o.rid, o.how, o.ctx, o.root, chainString(o.chain), chainString(o.croot), owner)
		}
		h[1]++
		byHow[o.how] = h
	}
	t.Logf("CPython %s %v: %d requests (%d responses with a root), %d outbound: %d right, %d wrong, %d unmatched root, %d no root; by call site %v; %.1f link-probe hits per request",
		in.Version, appArgs, n, len(ridOfRoot), res.outbound, res.correct, res.wrong, res.unknown, res.noRoot, byHow,
		float64(res.links)/float64(n))
	return res
}

func statSum(t *testing.T, objs *pytestbpf.Objects, s Status) uint64 {
	return mapStat(t, objs.GtPyStats, s)
}

// TestStackAttribution is the in-process causality check on the real stack:
// FastAPI on uvicorn (h11, httptools; with and without Starlette's
// BaseHTTPMiddleware), aiohttp client calls from the handler, gather
// children, create_task children and aiohttp's body writer, keep-alive load
// at concurrency 1, 16, 64 and 256. Every outbound request must carry the
// root of its own inbound request; none may carry another's.
func TestStackAttribution(t *testing.T) {
	requireRoot(t)
	type run struct {
		args []string
		n, c int
	}
	runs := []run{
		{[]string{"--http", "h11"}, 200, 16},
		{[]string{"--http", "httptools"}, 200, 16},
		{[]string{"--http", "h11", "--middleware"}, 200, 16},
		{[]string{"--http", "httptools", "--middleware"}, 200, 16},
	}
	if !testing.Short() {
		runs = append(runs,
			run{[]string{"--http", "h11", "--middleware"}, 50, 1},
			run{[]string{"--http", "httptools", "--middleware"}, 256, 64},
			run{[]string{"--http", "h11"}, 512, 256},
		)
	}
	for _, which := range []string{"debian", "trixie"} {
		for _, r := range runs {
			t.Run(fmt.Sprintf("%s%s-c%d", which, strings.Join(r.args, ""), r.c), func(t *testing.T) {
				res := runStack(t, which, r.n, r.c, r.args...)
				if res.outbound < r.n*6 {
					t.Fatalf("saw %d outbound requests, want %d", res.outbound, r.n*7)
				}
				if res.wrong > 0 || float64(res.correct) < 0.995*float64(res.outbound) {
					t.Errorf("attribution: %d/%d right, %d wrong", res.correct, res.outbound, res.wrong)
				}
			})
		}
	}
}

// TestStackUvloop measures (does not require) attribution under uvloop, whose
// transport writes are deferred past the task step.
func TestStackUvloop(t *testing.T) {
	requireRoot(t)
	for _, which := range []string{"debian", "trixie"} {
		t.Run(which, func(t *testing.T) {
			res := runStack(t, which, 100, 16, "--loop", "uvloop", "--http", "httptools")
			if res.wrong > 0 {
				t.Errorf("uvloop: %d outbound calls attributed to the wrong request; unknown is acceptable, wrong is not", res.wrong)
			}
		})
	}
}

// TestStackCallSites runs the causality app with the link probes at
// PyContext_CopyCurrent's call sites, then on its return, on Gym's runtime
// (sid: CPython 3.14, uvloop, httptools), its default-loop fallback and
// the older builds' uvloop: every build here must be covered whole
// (FindCalls finds every call), no parent may be wrong, and the sites must
// give as many right ones as the return probe (this harness has no read
// rule, so under uvloop both give few).
func TestStackCallSites(t *testing.T) {
	requireRoot(t)
	if !SiteProbesWanted() {
		t.Skip("call-site probes are x86-64 only (or GYMTRACE_PY_SITES=0)")
	}
	for _, r := range []struct {
		which string
		args  []string
	}{
		{"sid", []string{"--loop", "uvloop", "--http", "httptools"}},
		{"sid", []string{"--http", "httptools", "--middleware"}},
		{"trixie", []string{"--loop", "uvloop", "--http", "httptools"}},
		{"debian", []string{"--http", "h11", "--middleware"}},
	} {
		t.Run(r.which+strings.Join(r.args, ""), func(t *testing.T) {
			site := runStackProbes(t, r.which, 200, 16, true, r.args...)
			ret := runStackProbes(t, r.which, 200, 16, false, r.args...)
			if site.outbound < 200*6 {
				t.Fatalf("saw %d outbound requests, want %d", site.outbound, 200*7)
			}
			if site.wrong > 0 || float64(site.correct) < 0.995*float64(ret.correct) {
				t.Errorf("call-site probes: %d/%d right, %d wrong; the return probe: %d/%d right", site.correct, site.outbound, site.wrong,
					ret.correct, ret.outbound)
			}
			if site.links < ret.links*9/10 {
				t.Errorf("call-site probes linked %d contexts, the return probe %d", site.links, ret.links)
			}
		})
	}
}

func chainString(c [6]uint64) string {
	var parts []string
	for _, a := range c {
		if a == 0 {
			break
		}
		parts = append(parts, CtxID(a).String())
	}
	return strings.Join(parts, " <- ")
}
