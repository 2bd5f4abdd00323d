//go:build linux

// Package preflight checks, before anything is attached, that this machine and
// this process can run gymtrace: kernel features, mounts, lockdown and
// capabilities. `gymtrace check` prints the table; the tracer calls Required.
package preflight

import (
	"context"
)

// Options tunes Run.
type Options struct {
	// NoMount leaves tracefs, bpffs and securityfs alone instead of mounting them.
	NoMount bool
	// Traceparent makes sock_ops/sk_msg and CAP_NET_ADMIN required (traceparent
	// injection into requests to other hosts is enabled).
	Traceparent bool
	// StatusPath is the status file whose CapEff is checked (default /proc/self/status).
	StatusPath string
	// InjectSelfTest, when set, runs injection's start-up self-test
	// (inject.SelfTest): safe is false where injection would change what
	// the traced programs see, and detail says what.
	InjectSelfTest func() (safe bool, detail string, err error)
	// LoadPrograms loads gymtrace's own BPF programs through the verifier
	// (`gymtrace check`; the tracer's own load says as much when it fails).
	LoadPrograms bool
}

// Required runs the checks the tracer needs, mounting what it can, and returns
// Report.Err. Call it before attaching anything.
func Required(ctx context.Context) error {
	return Run(ctx, Options{}).Err()
}

// Paths checked; variables so tests can point at fakes.
var (
	btfPath        = "/sys/kernel/btf/vmlinux"
	tracefsPath    = "/sys/kernel/tracing"
	debugTracePath = "/sys/kernel/debug/tracing"
	bpffsPath      = "/sys/fs/bpf"
	securityfsPath = "/sys/kernel/security"
	mountinfoPath  = "/proc/self/mountinfo"
)

type checker struct {
	o       Options
	caps    capSet
	capsErr error
	major   int
	minor   int
	release string
	tracefs string // where tracefs is, "" if nowhere
	rep     Report
}

func (c *checker) add(r Result) { c.rep = append(c.rep, r) }

// Run performs every check and returns the rows. It never fails as a whole: a
// check that cannot run is a missing row saying why.
func Run(ctx context.Context, o Options) Report {
	if o.StatusPath == "" {
		o.StatusPath = "/proc/self/status"
	}
	c := &checker{o: o}
	c.caps, c.capsErr = effectiveCaps(o.StatusPath)
	steps := []func(){
		c.kernel, c.btf, c.capabilities, c.tracefs_, c.bpffs, c.lockdown, c.cgroup2,
		c.progTypes, c.maps, c.tracepointAttach, c.uprobeAttach, c.sockOpsAttach, c.injectSelfTest, c.programs,
	}
	for _, step := range steps {
		if ctx.Err() != nil {
			c.add(Result{Feature: "preflight", Status: StatusMissing, Need: NeedRequired,
				Detail: ctx.Err().Error(), Fix: "the check was interrupted; run it again"})
			break
		}
		step()
	}
	return c.rep
}
