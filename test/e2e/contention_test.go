//go:build linux

package e2e

// Contention as a test condition: the machines Gym runs on are busy. A
// causality case with contention runs beside one busy loop per core at
// normal priority and a process making small traced syscalls (1-byte
// write(2) to /dev/null: every one runs gymtrace's sys_exit_write program,
// which turns it away at the target test) as fast as it can, one writer
// thread per core. Both are child modes of this test binary; each reports
// what it did when the case asks, so the case can prove the load ran.

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// minSyscallRate is the syscall process's rate the issue asks for.
const minSyscallRate = 100_000

// childLoad runs one load child ("burn" or "syscalls") until its stdin says
// "report" (it prints "load N SECONDS" and exits) or closes.
func childLoad(mode string) int {
	var n atomic.Uint64
	start := time.Now()
	writers := 1
	if mode == "syscalls" {
		// One writer per core: beside other load (CI's kernel-matrix guests)
		// one thread's fair share fell to 70,818 write(2)s a second, under
		// the rate asked for; the process as a whole keeps it.
		writers = runtime.NumCPU()
	}
	for range writers {
		go spin(mode, &n)
	}
	buf := make([]byte, 64)
	for {
		k, err := os.Stdin.Read(buf)
		if err != nil || strings.Contains(string(buf[:k]), "report") {
			fmt.Printf("load %d %.3f\n", n.Load(), time.Since(start).Seconds())
			return 0
		}
	}
}

// spin runs one load child's work, counting it in n, until the process ends.
func spin(mode string, n *atomic.Uint64) {
	switch mode {
	case "burn":
		x := uint64(1)
		for {
			// Work the compiler cannot drop, counted in batches.
			for range 1 << 16 {
				x = x*6364136223846793005 + 1442695040888963407
			}
			n.Add(1 << 16)
			if x == 0 {
				fmt.Print("")
			}
		}
	case "syscalls":
		f, err := os.OpenFile("/dev/null", os.O_WRONLY, 0)
		if err != nil {
			fmt.Fprintf(os.Stderr, "opening /dev/null: %v\n", err)
			os.Exit(1)
		}
		defer f.Close() // keeps f, and so its fd, open: only the fd is used below
		fd := int(f.Fd())
		b := []byte{0}
		for {
			for range 1024 {
				unix.Write(fd, b)
			}
			n.Add(1024)
		}
	}
}

// contention is the load beside one causality case.
type contention struct {
	burn     []*proc
	syscalls *proc
}

// startContention starts one busy loop per core and the syscall process.
func startContention(t *testing.T) *contention {
	t.Helper()
	c := &contention{}
	for range runtime.NumCPU() {
		c.burn = append(c.burn, startChild(t, "burn"))
	}
	c.syscalls = startChild(t, "syscalls")
	return c
}

// report stops the load and checks that it ran: every busy loop spun, and
// the syscall process kept up at least minSyscallRate.
func (c *contention) report(t *testing.T) string {
	t.Helper()
	read := func(p *proc) (uint64, float64) {
		p.Stdin.Write([]byte("report\n"))
		line := p.WaitOutput(t, false, "load ", 30*time.Second)
		f := strings.Fields(strings.TrimSpace(line))
		if len(f) != 3 {
			t.Fatalf("%s: unexpected report %q", p.Name, line)
		}
		n, err1 := strconv.ParseUint(f[1], 10, 64)
		s, err2 := strconv.ParseFloat(f[2], 64)
		if err1 != nil || err2 != nil || s <= 0 {
			t.Fatalf("%s: unexpected report %q", p.Name, line)
		}
		return n, s
	}
	var spins []string
	for _, p := range c.burn {
		n, s := read(p)
		if n == 0 {
			t.Errorf("contention: busy loop %d never ran", p.Pid())
		}
		spins = append(spins, fmt.Sprintf("%.0fM/s", float64(n)/s/1e6))
	}
	n, s := read(c.syscalls)
	rate := float64(n) / s
	if rate < minSyscallRate {
		t.Errorf("contention: the syscall process made %.0f syscalls a second, want at least %d", rate, minSyscallRate)
	}
	return fmt.Sprintf("busy loops %s; %.0f write(2)s a second", strings.Join(spins, ", "), rate)
}
