package pressure

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
)

// stat is what the sampler needs of one /proc/PID/stat.
type stat struct {
	ppid  int
	self  uint64 // utime + stime: the process's own CPU, every thread, in clock ticks
	reap  uint64 // cutime + cstime: the CPU of its children it has waited for
	start uint64 // starttime: clock ticks after boot (names the process with its PID)
	rss   uint64 // resident pages
}

// parseStat reads /proc/PID/stat. comm (field 2) is in parentheses and may
// hold spaces and parentheses itself, so the fields are counted from the
// last ')'.
func parseStat(b []byte) (stat, error) {
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return stat{}, errors.New("no ')' closing the comm field")
	}
	// After ") ": field 3 (state) is index 0. We need fields 4 (ppid),
	// 14–17 (utime, stime, cutime, cstime), 22 (starttime), 24 (rss).
	want := [...]int{4, 14, 15, 16, 17, 22, 24}
	var got [len(want)]uint64
	field, wi := 3, 0
	rest := b[end+1:]
	for wi < len(want) {
		// Skip spaces to the next field.
		i := 0
		for i < len(rest) && rest[i] == ' ' {
			i++
		}
		rest = rest[i:]
		if len(rest) == 0 || rest[0] == '\n' {
			return stat{}, fmt.Errorf("%d fields, want at least %d", field-1, want[len(want)-1])
		}
		j := bytes.IndexAny(rest, " \n")
		if j < 0 {
			j = len(rest)
		}
		if field == want[wi] {
			tok := rest[:j]
			// ppid and rss are signed in the kernel's format (rss is never
			// negative in practice; a negative one is refused, not wrapped).
			v, err := strconv.ParseUint(string(tok), 10, 64)
			if err != nil {
				return stat{}, fmt.Errorf("field %d %q: %w", field, tok, err)
			}
			got[wi] = v
			wi++
		}
		rest = rest[j:]
		field++
	}
	return stat{ppid: int(got[0]), self: got[1] + got[2], reap: got[3] + got[4], start: got[5], rss: got[6]}, nil
}

// meminfo is what the host gauges need of /proc/meminfo, in KiB.
type meminfo struct {
	total, free, buffers, cached, sreclaimable uint64
	seen                                       uint8 // which of the five were found
}

// parseMeminfo reads /proc/meminfo's MemTotal, MemFree, Buffers, Cached and
// SReclaimable (every kernel gymtrace supports has them).
func parseMeminfo(b []byte) (meminfo, error) {
	var m meminfo
	keys := [...]struct {
		name string
		dst  *uint64
	}{{"MemTotal:", &m.total}, {"MemFree:", &m.free}, {"Buffers:", &m.buffers}, {"Cached:", &m.cached}, {"SReclaimable:", &m.sreclaimable}}
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		for k, key := range keys {
			if !bytes.HasPrefix(line, []byte(key.name)) {
				continue
			}
			f := bytes.Fields(line[len(key.name):])
			if len(f) != 2 || string(f[1]) != "kB" {
				return meminfo{}, fmt.Errorf("%s line %q: want a number of kB", key.name, line)
			}
			v, err := strconv.ParseUint(string(f[0]), 10, 64)
			if err != nil {
				return meminfo{}, fmt.Errorf("%s line %q: %w", key.name, line, err)
			}
			*key.dst = v
			m.seen |= 1 << k
		}
	}
	if m.seen != 1<<len(keys)-1 || m.total == 0 {
		return meminfo{}, errors.New("MemTotal, MemFree, Buffers, Cached or SReclaimable missing")
	}
	return m, nil
}

// usedKiB is psutil's virtual_memory().used on Linux, which Gym records as
// gym.host.memory_used_mib: total − free − buffers − cached, where cached
// counts reclaimable slab too; total − free when that is negative (a
// container's odd meminfo).
func (m meminfo) usedKiB() uint64 {
	used := int64(m.total) - int64(m.free) - int64(m.buffers) - int64(m.cached) - int64(m.sreclaimable)
	if used < 0 {
		used = int64(m.total) - int64(m.free)
	}
	if used < 0 {
		return 0
	}
	return uint64(used)
}

// readInto reads the whole small file at path into buf (grown when
// needed): one open, one or two reads, no allocation per file.
func readInto(path string, buf []byte) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return buf[:0], err
	}
	defer f.Close()
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
		if n == 0 {
			return buf, nil
		}
	}
}
