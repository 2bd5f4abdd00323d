//go:build linux

package loader

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/gymtrace/gymtrace/internal/probesite"
	"golang.org/x/sys/unix"
)

// VerifiedLimit is the verifier's budget of processed instructions per
// program load (BPF_COMPLEXITY_LIMIT_INSNS); a program's global functions
// count against its own load.
const VerifiedLimit = 1_000_000

// ProgramResult is one program of a variant, loaded on its own (no attach)
// with the verifier's statistics.
type ProgramResult struct {
	Name     string
	Type     ebpf.ProgramType
	Verified int           // instructions the verifier processed ("processed N insns"); 0 if unknown
	Frames   []Frame       // the program's functions and their stack depth, as the verifier measured them
	Stack    int           // the deepest chain of frames as this kernel adds them up (StackRounding)
	Chain    []string      // that chain
	Took     time.Duration // the load, verification included
	Err      error         // the verifier's refusal (or another load error)
}

// Frame is one function of a program and its stack depth in bytes.
type Frame struct {
	Name  string
	Depth int
}

// Refusal says, in words, why the kernel refused the program; "" when it
// loaded.
func (r ProgramResult) Refusal() string {
	if r.Err == nil {
		return ""
	}
	why, _ := explainRefusal(r.Err)
	return why
}

// Fix says what to do about a refusal.
func (r ProgramResult) Fix() string {
	if r.Err == nil {
		return ""
	}
	_, fix := explainRefusal(r.Err)
	return fix
}

// VerifyReport is a whole variant, program by program.
type VerifyReport struct {
	Variant    Variant
	StackRound int // this kernel's rounding of each frame (StackRounding)
	Programs   []ProgramResult
	// Optional programs this kernel cannot run, loaded as no-ops as Load
	// loads them (their features are off).
	Unsupported []Unsupported
	// What the kernel does to uprobe programs halfway, and the features
	// that stay off for it (Preemption.PythonUnsafe, TLSUnsafe).
	Preemption Preemption
}

// Failed lists the programs the kernel refused.
func (v VerifyReport) Failed() []ProgramResult {
	var out []ProgramResult
	for _, p := range v.Programs {
		if p.Err != nil {
			out = append(out, p)
		}
	}
	return out
}

// MaxVerified is the largest verified-instruction count and its program.
func (v VerifyReport) MaxVerified() (int, string) {
	n, name := 0, ""
	for _, p := range v.Programs {
		if p.Verified > n {
			n, name = p.Verified, p.Name
		}
	}
	return n, name
}

// MaxStack is the largest combined stack and its program.
func (v VerifyReport) MaxStack() (int, string) {
	n, name := 0, ""
	for _, p := range v.Programs {
		if p.Stack > n {
			n, name = p.Stack, p.Name
		}
	}
	return n, name
}

// VerifyOptions tune Verify.
type VerifyOptions struct {
	Variant *Variant                  // the variant to load; nil: the one this kernel gets (PickVariant)
	Only    func(program string) bool // load only these programs; nil: all
	// Progress, when set, is called before each program's load (a refused
	// program can take minutes on a slow machine).
	Progress func(program string)
	// PinSyscalls loads the syscall programs holding preemption off
	// (gt_sys_pin) whether or not this kernel runs them preemptible: what
	// such a kernel's verifier is given, checked on this one's.
	PinSyscalls bool
}

// Verify loads every program of a variant into the kernel, one at a time
// and without attaching any, and records what the verifier says of each: a
// program it refuses does not stop the others. The maps are created once
// and shared. It needs the privileges Load needs.
func Verify(o VerifyOptions) (VerifyReport, error) {
	v := o.Variant
	if v == nil {
		pv, _, err := PickVariant()
		if err != nil {
			return VerifyReport{}, err
		}
		v = &pv
	}
	rep := VerifyReport{Variant: *v, StackRound: StackRounding()}
	if err := rlimit.RemoveMemlock(); err != nil {
		return rep, fmt.Errorf("removing the memlock limit (needs CAP_SYS_RESOURCE on kernels before 5.11): %w", err)
	}
	spec, err := v.Spec()
	if err != nil {
		return rep, err
	}
	rep.Unsupported = stubUnsupported(spec, *v)
	rep.Preemption = probePreemption()
	if err := applyPreemption(spec, rep.Preemption); err != nil {
		return rep, err
	}
	if o.PinSyscalls {
		if err := pinSyscalls(spec); err != nil {
			return rep, err
		}
	}
	// The uprobe programs typed as Load types them (uprobe_multi where the
	// kernel takes it): the verifier sees what Load gives it.
	probesite.PrepareMulti(spec)
	// A small ring: the check needs the map, not its room.
	spec.Maps["gt_events"].MaxEntries = 1 << 16
	maps := map[string]*ebpf.Map{}
	defer func() {
		for _, m := range maps {
			m.Close()
		}
	}()
	for name, ms := range spec.Maps {
		if strings.HasPrefix(name, ".") {
			continue // global data: each load makes its own, frozen with the same bytes
		}
		m, err := ebpf.NewMap(ms)
		if err != nil {
			return rep, fmt.Errorf("creating map %s: %w", name, err)
		}
		maps[name] = m
	}
	names := make([]string, 0, len(spec.Programs))
	for name := range spec.Programs {
		if o.Only == nil || o.Only(name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		if o.Progress != nil {
			o.Progress(name)
		}
		rep.Programs = append(rep.Programs, verifyOne(spec, name, maps, rep.StackRound))
	}
	return rep, nil
}

// verifyLogLevel is the verifier log Verify asks for (tests ask for more).
var verifyLogLevel = ebpf.LogLevelStats

func verifyOne(spec *ebpf.CollectionSpec, name string, maps map[string]*ebpf.Map, round int) ProgramResult {
	ps := spec.Programs[name]
	r := ProgramResult{Name: name, Type: ps.Type}
	one := spec.Copy()
	for n := range one.Programs {
		if n != name {
			delete(one.Programs, n)
		}
	}
	// Only the maps this program uses (NewCollection would create the
	// others again).
	repl := map[string]*ebpf.Map{}
	used := map[string]bool{}
	for _, ins := range ps.Instructions {
		if ref := ins.Reference(); ref != "" {
			used[ref] = true
		}
	}
	for n := range one.Maps {
		if m, ok := maps[n]; ok && used[n] {
			repl[n] = m
		} else if !strings.HasPrefix(n, ".") && !used[n] {
			delete(one.Maps, n)
		}
	}
	start := time.Now()
	coll, err := ebpf.NewCollectionWithOptions(one, ebpf.CollectionOptions{
		MapReplacements: repl,
		Programs:        ebpf.ProgramOptions{LogLevel: verifyLogLevel, LogSizeStart: 1 << 16},
	})
	r.Took = time.Since(start)
	if err != nil {
		r.Err = err
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			r.Verified = processedInsns(strings.Join(ve.Log, "\n"))
		}
	} else {
		defer coll.Close()
		p := coll.Programs[name]
		if info, err := p.Info(); err == nil {
			if n, ok := info.VerifiedInstructions(); ok {
				r.Verified = int(n)
			}
		}
		if r.Verified == 0 {
			r.Verified = processedInsns(p.VerifierLog)
		}
	}
	// The frames the verifier adds up are those of the instructions as
	// loaded: the depths its log prints come after it has inlined
	// bpf_loop, which takes 24 bytes more in the caller's frame.
	depths, calls := programFrames(ps)
	for _, f := range functionOrder(ps) {
		r.Frames = append(r.Frames, Frame{f, depths[f]})
	}
	r.Stack, r.Chain = deepestChain(name, depths, calls, round)
	return r
}

var processedRE = regexp.MustCompile(`processed (\d+) insns`)

// StackRounding is how this kernel's verifier rounds each frame of a call
// chain before it holds the sum to 512 bytes: up to 16 bytes for JITed
// programs from Linux 6.9, up to 32 bytes (and at least 32) before, and
// without the JIT. A bpf_loop callback's frame counts on top of its
// caller's on every kernel (measured on 6.1 and 6.12).
func StackRounding() int {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return 32
	}
	var major, minor int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor)
	if major < 6 || major == 6 && minor < 9 {
		return 32
	}
	if b, err := os.ReadFile("/proc/sys/net/core/bpf_jit_enable"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return 32
	}
	return 16
}

func processedInsns(log string) int {
	m := processedRE.FindAllStringSubmatch(log, -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

func functionOrder(ps *ebpf.ProgramSpec) []string {
	var out []string
	for _, ins := range ps.Instructions {
		if sym := ins.Symbol(); sym != "" {
			out = append(out, sym)
		}
	}
	return out
}

var (
	tooLargeRE  = regexp.MustCompile(`BPF program is too large. Processed (\d+) insn`)
	jumpsRE     = regexp.MustCompile(`The sequence of (\d+) jumps is too complex`)
	stackSizeRE = regexp.MustCompile(`combined stack size of (\d+) calls is (\d+)`)
	// cilium/ebpf rewrites a call of a weak kfunc the kernel lacks as a
	// call of this helper number; the verifier names it when the call is
	// reachable (6.1 does so with EACCES, which cilium/ebpf does not turn
	// into its unknown-kfunc error).
	kfuncPoison = fmt.Sprintf("unknown#%d", 0xdedc0de)
	helperRE    = regexp.MustCompile(`(?:unknown func|invalid func|program of this type cannot use helper) ([a-z_0-9]+)#(\d+)`)
)

// explainRefusal turns a load error into why, in words, and what to do.
func explainRefusal(err error) (why, fix string) {
	const report = "; report it with the output of `gymtrace check` and `uname -r`"
	other := "try the other build of the programs (GYMTRACE_BPF_VARIANT=iter or bounded)"
	var ve *ebpf.VerifierError
	var log string
	last := ""
	if errors.As(err, &ve) {
		log = strings.Join(ve.Log, "\n")
		// The verifier's own words: its last line before the statistics.
		for i := len(ve.Log) - 1; i >= 0; i-- {
			l := strings.TrimSpace(ve.Log[i])
			if l == "" || strings.HasPrefix(l, "verification time") || strings.HasPrefix(l, "stack depth") ||
				strings.HasPrefix(l, "processed ") {
				continue
			}
			last = l
			break
		}
	}
	msg := err.Error()
	switch {
	case tooLargeRE.MatchString(log):
		m := tooLargeRE.FindStringSubmatch(log)
		return fmt.Sprintf("the verifier gave up after %s instructions, its limit: this kernel's verifier follows more paths through the program than it allows", m[1]),
			"run gymtrace on a kernel it is tested on (docs/kernels.md), or " + other + report
	case jumpsRE.MatchString(log):
		return "the verifier gave up: more branches were waiting to be followed than it allows (8192)",
			"run gymtrace on a kernel it is tested on (docs/kernels.md), or " + other + report
	case stackSizeRE.MatchString(log):
		m := stackSizeRE.FindStringSubmatch(log)
		return fmt.Sprintf("its deepest chain of %s calls needs %s bytes of stack, over the 512 the verifier allows", m[1], m[2]),
			"this is a gymtrace bug on this kernel (TestCombinedStackWithinLimit holds every chain to the limit with frames rounded as this kernel rounds them)" + report
	case strings.Contains(msg, "unknown kfunc") || strings.Contains(log, "kernel function") && strings.Contains(log, "not") ||
		strings.Contains(log, kfuncPoison):
		return "the program calls a kernel function (kfunc) this kernel does not have",
			"gymtrace picks the bounded-loop build where bpf_iter_num_new is missing; set GYMTRACE_BPF_VARIANT=bounded" + report
	case helperRE.MatchString(log):
		m := helperRE.FindStringSubmatch(log)
		return fmt.Sprintf("this kernel does not let this kind of program call the helper %s (#%s)", m[1], m[2]),
			"a newer kernel has it; " + other + report
	case strings.Contains(msg, "bad CO-RE relocation") || strings.Contains(msg, "CO-RE"):
		return "a kernel structure gymtrace reads is not laid out as the program expects (CO-RE: " + msg + ")",
			"check that /sys/kernel/btf/vmlinux belongs to the running kernel" + report
	case last != "":
		// The verifier's EACCES (its "permission denied") is a refusal
		// like any other: its log says why.
		return "the verifier refused it: " + last, "this is a gymtrace bug on this kernel; " + other + report
	case errors.Is(err, unix.EPERM):
		return "the kernel did not allow the load (" + msg + ")",
			"run as root, or with CAP_BPF, CAP_PERFMON and CAP_SYS_RESOURCE (see the capability rows)"
	}
	return msg, other + report
}
