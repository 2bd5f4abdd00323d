package discover

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"go.yaml.in/yaml/v3"
)

// Gym's environment contract with its server processes.
const (
	EnvConfigPath = "NEMO_GYM_CONFIG_PATH" // the server's name
	EnvConfigDict = "NEMO_GYM_CONFIG_DICT" // the global config, YAML
	EnvWorker     = "IS_NEMO_GYM_FASTAPI_WORKER"
)

const errSRCH = syscall.ESRCH

// isGone reports an error from reading a /proc file of a process that exited.
func isGone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

// ErrNoProcess is wrapped by Inspect when the PID does not exist.
var ErrNoProcess = errors.New("no such process")

// FS reads processes from a proc filesystem. Root is configurable so tests can
// use fake trees; NodeName is the Kubernetes node gymtrace runs on (downward API),
// given to processes that turn out to live in a pod.
type FS struct {
	Root     string
	NodeName string
}

// NewFS returns an FS over root ("/proc" when empty). The node name comes from
// the first of NODE_NAME, K8S_NODE_NAME set in gymtrace's own environment.
func NewFS(root string) *FS {
	if root == "" {
		root = "/proc"
	}
	node := os.Getenv("NODE_NAME")
	if node == "" {
		node = os.Getenv("K8S_NODE_NAME")
	}
	return &FS{Root: root, NodeName: node}
}

// Default reads the host's /proc (with hostPID in a pod, the node's processes).
var Default = NewFS("/proc")

// Inspect describes one process of the host, whether or not it looks like Gym.
func Inspect(pid int) (*Process, error) { return Default.Inspect(pid) }

// Scan lists every Gym process of the host.
func Scan() ([]*Process, error) { return Default.Scan() }

func (f *FS) path(pid int, name string) string {
	return filepath.Join(f.Root, strconv.Itoa(pid), name)
}

// snapshot is what one pass over /proc/PID reads; gym says whether the process
// looks like one of Gym's servers or its collector.
type snapshot struct {
	proc    Process
	argv    []string
	env     map[string]string
	envErr  error
	exe     string
	cwd     string
	gym     bool
	python  bool
	tracker bool // multiprocessing's resource/semaphore tracker: never a server
}

// Inspect reads /proc/PID/{stat,status,comm,cmdline,environ,cgroup}. A PID that
// names a thread is resolved to its process.
func (f *FS) Inspect(pid int) (*Process, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("process id %d is not valid: give a positive PID (see `ps -e`)", pid)
	}
	s, err := f.read(pid)
	if err != nil {
		return nil, err
	}
	if s.envErr != nil && !s.gym {
		// An explicit --pid we cannot identify is worth saying why.
		return nil, fmt.Errorf("reading the environment of process %d: %w; run gymtrace as root or grant it CAP_SYS_PTRACE", pid, s.envErr)
	}
	f.placement(s)
	return &s.proc, nil
}

func (f *FS) read(pid int) (*snapshot, error) {
	st, err := os.ReadFile(f.path(pid, "stat"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errSRCH) {
			return nil, fmt.Errorf("process %d does not exist; check the PID (ps -p %d), or leave out --pid to discover Gym processes: %w", pid, pid, ErrNoProcess)
		}
		return nil, fmt.Errorf("reading %s: %w", f.path(pid, "stat"), err)
	}
	s := &snapshot{}
	p := &s.proc
	p.PID = pid
	if err := parseStat(st, p); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", f.path(pid, "stat"), err)
	}
	if status, err := os.ReadFile(f.path(pid, "status")); err == nil {
		tgid, nspid, ppid := parseStatus(status)
		if tgid > 0 && tgid != pid {
			// A thread id: /proc/TID exists but describes the thread; name the process.
			return f.read(tgid)
		}
		if nspid > 0 {
			p.NSPID = nspid
		}
		if ppid >= 0 {
			p.PPID = ppid
		}
	} else if isGone(err) {
		return nil, fmt.Errorf("process %d does not exist (it exited): %w", pid, ErrNoProcess)
	}
	if p.NSPID == 0 {
		p.NSPID = pid
	}
	if comm, err := os.ReadFile(f.path(pid, "comm")); err == nil {
		p.Comm = strings.TrimRight(string(comm), "\n")
	}
	if cmd, err := os.ReadFile(f.path(pid, "cmdline")); err == nil {
		s.argv = splitNUL(cmd)
	}
	if env, err := os.ReadFile(f.path(pid, "environ")); err == nil {
		s.env = parseEnviron(env)
	} else if !isGone(err) {
		s.envErr = err
	}
	s.exe, _ = os.Readlink(f.path(pid, "exe"))
	s.cwd, _ = os.Readlink(f.path(pid, "cwd"))
	identify(s)
	return s, nil
}

// placement fills container and Kubernetes identity (cgroup, pod files).
func (f *FS) placement(s *snapshot) {
	p := &s.proc
	if cg, err := os.ReadFile(f.path(p.PID, "cgroup")); err == nil {
		p.ContainerID, p.K8sPodUID = parseCgroup(cg)
	}
	if p.K8sPodUID == "" {
		return
	}
	p.K8sNodeName = f.NodeName
	// Kubernetes sets HOSTNAME to the pod name unless the pod overrides hostname.
	if h := s.env["HOSTNAME"]; h != "" && s.env["KUBERNETES_SERVICE_HOST"] != "" {
		p.K8sPodName = h
	}
	// The service-account mount names the pod's namespace; read through the
	// process's own root so it works across mount namespaces.
	if ns, err := os.ReadFile(filepath.Join(f.path(p.PID, "root"), "var/run/secrets/kubernetes.io/serviceaccount/namespace")); err == nil {
		p.K8sNamespace = strings.TrimSpace(string(ns))
	}
	if v := s.env["POD_NAMESPACE"]; p.K8sNamespace == "" && v != "" {
		p.K8sNamespace = v
	}
	if v := s.env["POD_NAME"]; v != "" {
		p.K8sPodName = v
	}
}

// identify decides whether a process is one of Gym's and, if so, its name and role.
func identify(s *snapshot) {
	p := &s.proc
	s.python = isPython(p.Comm, s.exe, s.argv)
	s.tracker = isTracker(s.argv)
	p.Worker = s.env[EnvWorker] == "1"

	if name, ok := s.env[EnvConfigPath]; ok && name != "" {
		s.gym = true
		p.ServerName = name
		p.Role = roleFromConfig(s.env[EnvConfigDict], name)
	}
	if p.Role == RoleUnknown {
		if role, impl := roleFromCommand(s.argv, s.cwd); role != RoleUnknown {
			s.gym = true
			p.Role = role
			if p.ServerName == "" {
				p.ServerName = impl
			}
		}
	}
	if p.Role == RoleOrchestrator && p.ServerName == "" {
		p.ServerName = TypeOrchestrator
	}
}

var pythonPrefixes = []string{"python", "pypy"}

// isPython tells a Python interpreter from the shells and launchers (bash -c,
// uv run, docker for sandboxes) that inherit Gym's environment but serve nothing.
func isPython(comm, exe string, argv []string) bool {
	names := []string{filepath.Base(exe), comm}
	if len(argv) > 0 {
		names = append(names, filepath.Base(argv[0]))
	}
	for _, n := range names {
		for _, pre := range pythonPrefixes {
			if strings.HasPrefix(n, pre) {
				return true
			}
		}
	}
	return false
}

func isTracker(argv []string) bool {
	for _, a := range argv {
		if strings.Contains(a, "multiprocessing.resource_tracker") || strings.Contains(a, "multiprocessing.semaphore_tracker") {
			return true
		}
	}
	return false
}

func isSpawnChild(argv []string) bool {
	for _, a := range argv {
		if strings.Contains(a, "multiprocessing.spawn") || strings.Contains(a, "multiprocessing.forkserver") {
			return true
		}
	}
	return false
}

// Commands that run Gym's rollout collection or head server.
var orchestratorCommands = map[string]bool{
	"ng_collect_rollouts":     true,
	"ng_e2e_collect_rollouts": true,
	"ng_run":                  true,
}

var typeDirs = []string{TypeAgents, TypeModels, TypeResources}

// roleFromCommand reads the role from the command line (collector commands, or an
// entrypoint under a server-type directory) or, for `cd dir && python app.py`,
// from the working directory. impl is the implementation directory name.
func roleFromCommand(argv []string, cwd string) (role uint8, impl string) {
	for i, a := range argv {
		base := filepath.Base(a)
		if orchestratorCommands[base] {
			return RoleOrchestrator, ""
		}
		if base == "gym" && i+1 < len(argv) && (argv[i+1] == "eval" || argv[i+1] == "env") {
			return RoleOrchestrator, ""
		}
	}
	for _, a := range argv {
		if r, impl := roleFromPath(a); r != RoleUnknown {
			return r, impl
		}
	}
	if cwd != "" {
		return roleFromPath(cwd + "/")
	}
	return RoleUnknown, ""
}

func roleFromPath(path string) (uint8, string) {
	parts := strings.Split(filepath.ToSlash(path), "/")
	for i := 0; i+1 < len(parts); i++ {
		for _, t := range typeDirs {
			if parts[i] == t && parts[i+1] != "" && !strings.HasSuffix(parts[i+1], ".py") {
				return RoleForType(t), parts[i+1]
			}
		}
	}
	return RoleUnknown, ""
}

// roleFromConfig finds the server's type key in Gym's config dict. The usual
// shape is {name: {type_key: {implementation: {...}}}}; it also accepts the
// server's block on its own, a dotted name, the dict as a JSON string, and a
// type key one level further down.
func roleFromConfig(dict, name string) uint8 {
	if strings.TrimSpace(dict) == "" {
		return RoleUnknown
	}
	key := configKey{name: name, sum: fnv64(dict), n: len(dict)}
	configCache.Lock()
	r, ok := configCache.m[key]
	configCache.Unlock()
	if ok {
		return r
	}
	r = parseRole(dict, name)
	configCache.Lock()
	if len(configCache.m) >= 256 {
		clear(configCache.m)
	}
	configCache.m[key] = r
	configCache.Unlock()
	return r
}

// Every worker and rescan sees the same (often large) config dict: parse each once.
type configKey struct {
	name string
	sum  uint64
	n    int
}

var configCache = struct {
	sync.Mutex
	m map[configKey]uint8
}{m: make(map[configKey]uint8)}

func fnv64(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

func parseRole(dict, name string) uint8 {
	var root any
	if err := yaml.Unmarshal([]byte(dict), &root); err != nil {
		return RoleUnknown
	}
	if s, ok := root.(string); ok { // double-encoded
		if err := yaml.Unmarshal([]byte(s), &root); err != nil {
			return RoleUnknown
		}
	}
	m, ok := root.(map[string]any)
	if !ok {
		return RoleUnknown
	}
	if block, ok := lookup(m, name); ok {
		if r := typeKeyIn(block, 2); r != RoleUnknown {
			return r
		}
	}
	// The server's own block handed over without its name.
	return typeKeyIn(m, 0)
}

func lookup(m map[string]any, name string) (any, bool) {
	if v, ok := m[name]; ok {
		return v, true
	}
	var cur any = m
	for _, part := range strings.Split(name, ".") {
		cm, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = cm[part]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// typeKeyIn looks for a server-type key in v, descending at most depth levels.
func typeKeyIn(v any, depth int) uint8 {
	m, ok := v.(map[string]any)
	if !ok {
		return RoleUnknown
	}
	for _, t := range typeDirs {
		if _, ok := m[t]; ok {
			return RoleForType(t)
		}
	}
	if depth == 0 {
		return RoleUnknown
	}
	// Only a single nested map is followed: several would be a whole config.
	if len(m) == 1 {
		for _, sub := range m {
			return typeKeyIn(sub, depth-1)
		}
	}
	return RoleUnknown
}

// parseStat reads comm, ppid and starttime from /proc/PID/stat. comm may hold
// spaces and parentheses, so fields are counted after the last ')'.
func parseStat(b []byte, p *Process) error {
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return errors.New("no comm field")
	}
	p.Comm = string(b[open+1 : end])
	f := strings.Fields(string(b[end+1:]))
	// f[0] is field 3 (state); ppid is field 4, starttime field 22.
	if len(f) < 20 {
		return fmt.Errorf("%d fields after comm, want at least 20", len(f))
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return fmt.Errorf("ppid %q: %w", f[1], err)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return fmt.Errorf("starttime %q: %w", f[19], err)
	}
	p.PPID, p.StartTime = ppid, start
	return nil
}

// parseStatus returns Tgid, the innermost NSpid and PPid (-1 when absent).
func parseStatus(b []byte) (tgid, nspid, ppid int) {
	ppid = -1
	for _, line := range strings.Split(string(b), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(val)
		if len(f) == 0 {
			continue
		}
		switch key {
		case "Tgid":
			tgid, _ = strconv.Atoi(f[0])
		case "NSpid":
			nspid, _ = strconv.Atoi(f[len(f)-1])
		case "PPid":
			ppid, _ = strconv.Atoi(f[0])
		}
	}
	return tgid, nspid, ppid
}

func splitNUL(b []byte) []string {
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return nil
	}
	parts := bytes.Split(b, []byte{0})
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = string(p)
	}
	return out
}

// parseEnviron keeps every variable: values are only looked up, never logged,
// since a process's environment can hold secrets.
func parseEnviron(b []byte) map[string]string {
	env := make(map[string]string)
	for _, kv := range splitNUL(b) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env
}

var (
	// 64 hex digits, optionally prefixed by the runtime's scope name.
	containerRe = regexp.MustCompile(`^(?:docker-|crio-|cri-containerd-|containerd-|libpod-)?([0-9a-f]{64})(?:\.scope)?$`)
	podRe       = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)
)

// parseCgroup extracts the container id and Kubernetes pod uid from
// /proc/PID/cgroup, cgroup v1 ("N:ctrl:/path") or v2 ("0::/path"), for the
// cgroupfs (/docker/<id>, /kubepods/.../pod<uid>/<id>) and systemd
// (docker-<id>.scope, kubepods-...-pod<uid>.slice/cri-containerd-<id>.scope)
// drivers. conmon's scope (libpod-conmon-<id>) is podman's monitor, not the container.
func parseCgroup(b []byte) (containerID, podUID string) {
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, comp := range strings.Split(parts[2], "/") {
			if m := containerRe.FindStringSubmatch(comp); m != nil {
				containerID = m[1]
			}
			if m := podRe.FindStringSubmatch(comp); m != nil && strings.Contains(parts[2], "kubepods") {
				podUID = strings.ReplaceAll(m[1], "_", "-")
			}
		}
		if containerID != "" {
			return containerID, podUID
		}
	}
	return containerID, podUID
}
