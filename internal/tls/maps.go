package tls

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// mapping is one executable file mapping of /proc/PID/maps.
type mapping struct {
	start, end uint64
	dev        string // "maj:min"
	inode      uint64
	path       string
}

// fileKey identifies a mapped file across processes and paths.
type fileKey struct {
	dev   string
	inode uint64
}

func (m mapping) key() fileKey { return fileKey{m.dev, m.inode} }

// execMappings lists the executable file mappings of pid, one per file.
func execMappings(procRoot string, pid int) ([]mapping, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "maps"))
	if err != nil {
		return nil, err
	}
	return parseMaps(b), nil
}

func parseMaps(b []byte) []mapping {
	var out []mapping
	seen := map[fileKey]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		// start-end perms offset dev inode path
		f := strings.Fields(sc.Text())
		if len(f) < 6 || len(f[1]) < 3 || f[1][2] != 'x' || !strings.HasPrefix(f[5], "/") {
			continue
		}
		r := strings.SplitN(f[0], "-", 2)
		if len(r) != 2 {
			continue
		}
		start, err1 := strconv.ParseUint(r[0], 16, 64)
		end, err2 := strconv.ParseUint(r[1], 16, 64)
		inode, err3 := strconv.ParseUint(f[4], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || inode == 0 {
			continue
		}
		// A path with spaces is joined back; " (deleted)" stays (the file
		// is still reachable through map_files).
		m := mapping{start: start, end: end, dev: f[3], inode: inode, path: strings.Join(f[5:], " ")}
		if seen[m.key()] {
			continue
		}
		seen[m.key()] = true
		out = append(out, m)
	}
	return out
}

// isLibSSL: libssl.so, libssl.so.3, libssl.so.1.1, libssl-<hash>.so.3 (wheels).
func isLibSSL(path string) bool {
	base := filepath.Base(strings.TrimSuffix(path, " (deleted)"))
	return strings.HasPrefix(base, "libssl") && strings.Contains(base, ".so")
}

// openPaths are the paths through which pid's mapping m can be opened, best
// first: map_files names the very inode mapped, across mount namespaces and
// after the file was replaced on disk (needs CAP_SYS_ADMIN or
// CAP_CHECKPOINT_RESTORE); /proc/PID/root/<path> is the fallback.
func openPaths(procRoot string, pid int, m mapping) []string {
	return []string{
		filepath.Join(procRoot, strconv.Itoa(pid), "map_files", fmt.Sprintf("%x-%x", m.start, m.end)),
		filepath.Join(procRoot, strconv.Itoa(pid), "root", strings.TrimSuffix(m.path, " (deleted)")),
	}
}
