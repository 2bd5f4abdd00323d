//go:build linux

// Command kload loads gymtrace's BPF objects into the running kernel, every
// program on its own and none attached, and prints what the verifier said
// of each: the instructions it processed (against its 1,000,000 limit) and
// the program's combined stack. scripts/kernel-matrix runs it inside each
// guest kernel; docs/kernels.md is made from its JSON (kload report).
//
//	kload [-variant picked|all|NAME,...] [-json FILE]
//	kload report [-host FILE] FILE...     a markdown table of the runs
//
// Exit status: 0 when the variant this kernel gets loads whole within the
// budget (every program under half the limit, every combined stack at most
// StackBudget bytes); 1 when it does not; 2 on bad usage. A refusal of a
// variant the kernel does not get is reported, not a failure.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/gymtrace/gymtrace/internal/loader"
	"golang.org/x/sys/unix"
)

// The margin every program keeps on every kernel: half the verifier's
// instruction budget, and a combined stack (frames rounded to 32 bytes, as
// the strictest kernels count them) well under the 512-byte limit.
const (
	VerifiedBudget = loader.VerifiedLimit / 2
	StackBudget    = 448
)

// Run is one kernel's results.
type Run struct {
	Kernel   string    `json:"kernel"`  // uname -r
	Version  string    `json:"version"` // /proc/version
	Packages []string  `json:"packages,omitempty"`
	Picked   string    `json:"picked"` // the variant this kernel gets
	Why      string    `json:"why"`
	Variants []Variant `json:"variants"`
	When     time.Time `json:"when"`
}

// Variant is one object's programs on this kernel.
type Variant struct {
	Name     string    `json:"name"`
	Says     string    `json:"says"`
	Programs []Program `json:"programs"`
	// Optional programs this kernel cannot run, loaded as no-ops (their
	// feature is off): "program: needs".
	Unsupported []string `json:"unsupported,omitempty"`
	StackRound  int      `json:"stack_round"` // how this kernel rounds each frame
}

// Program is one program's load.
type Program struct {
	Name     string   `json:"name"`
	Verified int      `json:"verified"`
	Stack    int      `json:"stack"`
	Chain    []string `json:"chain,omitempty"` // the deepest chain of frames, "name(bytes)"
	Seconds  float64  `json:"seconds"`
	Error    string   `json:"error,omitempty"`
	Refusal  string   `json:"refusal,omitempty"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "report" {
		os.Exit(report(os.Args[2:], os.Stdout, os.Stderr))
	}
	fs := flag.NewFlagSet("kload", flag.ExitOnError)
	which := fs.String("variant", "picked", "picked (the one this kernel gets), all, or names separated by commas")
	out := fs.String("json", "", "write the results as JSON to this file")
	pkgs := fs.String("packages", "", "a file listing the kernel's packages, one per line (recorded in the JSON)")
	fs.Parse(os.Args[1:])

	picked, why, err := loader.PickVariant()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kload: %v\n", err)
		os.Exit(1)
	}
	var u unix.Utsname
	unix.Uname(&u)
	run := Run{Kernel: unix.ByteSliceToString(u.Release[:]), Picked: picked.Name, Why: why, When: time.Now().UTC()}
	if b, err := os.ReadFile("/proc/version"); err == nil {
		run.Version = strings.TrimSpace(string(b))
	}
	if *pkgs != "" {
		if b, err := os.ReadFile(*pkgs); err == nil {
			run.Packages = strings.Fields(strings.ReplaceAll(string(b), " ", "="))
		}
	}
	var vs []loader.Variant
	switch *which {
	case "picked":
		vs = []loader.Variant{picked}
	case "all":
		vs = loader.Variants()
	default:
		for _, n := range strings.Split(*which, ",") {
			v, err := loader.VariantByName(n)
			if err != nil {
				fmt.Fprintf(os.Stderr, "kload: %v\n", err)
				os.Exit(2)
			}
			vs = append(vs, v)
		}
	}
	fmt.Printf("kernel %s: this kernel gets the %s variant (%s)\n", run.Kernel, picked.Name, why)
	ok := true
	for _, v := range vs {
		fmt.Printf("\nvariant %s (%s):\n", v.Name, v.Says)
		start := time.Now()
		rep, err := loader.Verify(loader.VerifyOptions{Variant: &v})
		if err != nil {
			fmt.Printf("  could not load: %v\n", err)
			if v.Name == picked.Name {
				ok = false
			}
			continue
		}
		vr := Variant{Name: v.Name, Says: v.Says, StackRound: rep.StackRound}
		for _, u := range rep.Unsupported {
			vr.Unsupported = append(vr.Unsupported, u.Program+": "+u.Needs)
			fmt.Printf("  %-26s left out: this kernel lacks %s (%s off)\n", u.Program, u.Needs, u.Feature)
		}
		for _, p := range rep.Programs {
			pr := Program{Name: p.Name, Verified: p.Verified, Stack: p.Stack, Seconds: p.Took.Seconds()}
			depth := map[string]int{}
			for _, f := range p.Frames {
				depth[f.Name] = f.Depth
			}
			for _, f := range p.Chain {
				pr.Chain = append(pr.Chain, fmt.Sprintf("%s(%d)", f, depth[f]))
			}
			status := "ok"
			switch {
			case p.Err != nil:
				pr.Error = p.Err.Error()
				pr.Refusal = p.Refusal()
				status = "REFUSED: " + pr.Refusal
			case p.Verified > VerifiedBudget || p.Stack > StackBudget:
				status = "OVER BUDGET"
			}
			if status != "ok" && v.Name == picked.Name {
				ok = false
			}
			fmt.Printf("  %-26s %8d insns %5.1f%%  stack %3d  %6.2fs  %s\n", p.Name, p.Verified,
				100*float64(p.Verified)/loader.VerifiedLimit, p.Stack, p.Took.Seconds(), status)
			vr.Programs = append(vr.Programs, pr)
		}
		n, name := rep.MaxVerified()
		s, sname := rep.MaxStack()
		fmt.Printf("  max: %d insns (%s, %.1f%% of the limit), stack %d bytes (%s), %d refused, %.1fs\n",
			n, name, 100*float64(n)/loader.VerifiedLimit, s, sname, len(rep.Failed()), time.Since(start).Seconds())
		for _, p := range vr.Programs {
			if p.Name == sname {
				fmt.Printf("  deepest chain: %s\n", strings.Join(p.Chain, " -> "))
			}
		}
		run.Variants = append(run.Variants, vr)
	}
	if *out != "" {
		b, _ := json.MarshalIndent(run, "", "  ")
		if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "kload: %v\n", err)
			os.Exit(1)
		}
	}
	if !ok {
		fmt.Printf("\nkload: the %s variant does not load on %s within the budget (%d insns, %d bytes of stack)\n",
			picked.Name, run.Kernel, VerifiedBudget, StackBudget)
		os.Exit(1)
	}
}

// Status is what the guest job says beside load.json (status.json): the
// exit status of `gymtrace check` and the smoke run's spans.
type Status struct {
	Check int `json:"check"`
	Spans int `json:"spans"`
	Wall  int `json:"wall_seconds"`
}

// report prints docs/kernels.md's tables from kload's JSON files: a row per
// kernel, then every program's verified instructions and stack on each.
func report(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kload report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	host := fs.String("host", "", "the host's own kload JSON, shown last")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	files := fs.Args()
	if *host != "" {
		files = append(files, *host)
	}
	if len(files) == 0 {
		fmt.Fprintln(stderr, "kload report: no JSON files")
		return 2
	}
	type col struct {
		run    Run
		status *Status
		v      *Variant
		host   bool
	}
	var cols []col
	var runs []col
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintln(stderr, "kload report:", err)
			return 1
		}
		var r Run
		if err := json.Unmarshal(b, &r); err != nil {
			fmt.Fprintf(stderr, "kload report: %s: %v\n", f, err)
			return 1
		}
		c := col{run: r, host: *host != "" && i == len(files)-1}
		if b, err := os.ReadFile(filepath.Join(filepath.Dir(f), "status.json")); err == nil {
			var st Status
			if json.Unmarshal(b, &st) == nil {
				c.status = &st
			}
		}
		runs = append(runs, c)
		for j := range r.Variants {
			if r.Variants[j].Name == r.Picked {
				c.v = &r.Variants[j]
			}
		}
		cols = append(cols, c)
	}
	w := stdout
	fmt.Fprintln(w, "| kernel | Debian package | build it gets | loads | most verified instructions | deepest stack | check | smoke |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, c := range runs {
		pkg := "the host's"
		for _, p := range c.run.Packages {
			if strings.HasPrefix(p, "linux-image-") && !strings.HasPrefix(p, "linux-image-amd64") {
				pkg = "`" + p + "`"
			}
		}
		loads, insns, stack := "no", "", ""
		for _, v := range c.run.Variants {
			if v.Name != c.run.Picked {
				continue
			}
			refused, maxN, maxS := 0, 0, 0
			var maxNP, maxSP string
			for _, p := range v.Programs {
				if p.Error != "" {
					refused++
				}
				if p.Verified > maxN {
					maxN, maxNP = p.Verified, p.Name
				}
				if p.Stack > maxS {
					maxS, maxSP = p.Stack, p.Name
				}
			}
			if refused == 0 {
				loads = fmt.Sprintf("yes, %d programs", len(v.Programs)-len(v.Unsupported))
				if len(v.Unsupported) > 0 {
					loads += fmt.Sprintf(" (%d left out: no injection)", len(v.Unsupported))
				}
			} else {
				loads = fmt.Sprintf("**no**: %d of %d refused", refused, len(v.Programs))
			}
			insns = fmt.Sprintf("%s (%.1f %%, %s)", thousands(maxN), 100*float64(maxN)/loader.VerifiedLimit, maxNP)
			stack = fmt.Sprintf("%d B, frames rounded to %d (%s)", maxS, v.StackRound, maxSP)
		}
		check, smoke := "", ""
		if c.status != nil {
			check = "ok"
			if c.status.Check != 0 {
				check = fmt.Sprintf("**failed** (%d)", c.status.Check)
			}
			smoke = fmt.Sprintf("%d of 10 spans", c.status.Spans)
		}
		name := c.run.Kernel
		if c.host {
			name += " (host)"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", name, pkg, c.run.Picked, loads, insns, stack, check, smoke)
	}
	var when time.Time
	for _, c := range runs {
		if c.run.When.After(when) {
			when = c.run.When
		}
	}
	fmt.Fprintf(w, "\nMeasured %s by `sudo ./scripts/kernel-matrix --doc` (the packages are the newest `linux-image-amd64` of each suite on that day).\n",
		when.Format("2006-01-02"))
	// Every program, on every kernel, in each build that kernel loaded.
	fmt.Fprintln(w)
	type key struct{ kernel, variant string }
	var heads []key
	cells := map[key]map[string]Program{}
	leftOut := map[key]map[string]bool{}
	names := map[string]bool{}
	for _, c := range runs {
		for _, v := range c.run.Variants {
			k := key{c.run.Kernel, v.Name}
			heads = append(heads, k)
			cells[k] = map[string]Program{}
			leftOut[k] = map[string]bool{}
			for _, p := range v.Programs {
				cells[k][p.Name] = p
				names[p.Name] = true
			}
			for _, u := range v.Unsupported {
				leftOut[k][strings.SplitN(u, ":", 2)[0]] = true
			}
		}
	}
	fmt.Fprint(w, "| program |")
	for _, h := range heads {
		fmt.Fprintf(w, " %s %s |", h.kernel, h.variant)
	}
	fmt.Fprint(w, "\n| --- |")
	for range heads {
		fmt.Fprint(w, " ---: |")
	}
	fmt.Fprintln(w)
	var sorted []string
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	for _, n := range sorted {
		fmt.Fprintf(w, "| `%s` |", n)
		for _, h := range heads {
			p, ok := cells[h][n]
			switch {
			case !ok:
				fmt.Fprint(w, " |")
			case leftOut[h][n]:
				fmt.Fprint(w, " left out |")
			case p.Error != "":
				fmt.Fprint(w, " refused |")
			default:
				fmt.Fprintf(w, " %s · %d |", thousands(p.Verified), p.Stack)
			}
		}
		fmt.Fprintln(w)
	}
	return 0
}

// thousands writes n with thousands separators.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
