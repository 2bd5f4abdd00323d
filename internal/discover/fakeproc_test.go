package discover

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/proc from hostSpecs")

// fakeProc describes one /proc/PID directory.
type fakeProc struct {
	pid, ppid, tgid int
	nspid           []int // NSpid line after the host pid; empty: not namespaced
	comm            string
	state           byte // 'S' when 0
	start           uint64
	argv            []string
	env             []string
	cgroup          string
	exe, cwd        string            // symlink targets ("" for none)
	files           map[string]string // extra files under root/ (e.g. the k8s namespace)
}

func (p fakeProc) write(t testing.TB, root string) {
	t.Helper()
	dir := filepath.Join(root, fmt.Sprint(p.pid))
	must(t, os.MkdirAll(dir, 0o755))
	state := p.state
	if state == 0 {
		state = 'S'
	}
	tgid := p.tgid
	if tgid == 0 {
		tgid = p.pid
	}
	start := p.start
	if start == 0 {
		start = uint64(1000 + p.pid)
	}
	// Fields 3..22 of /proc/PID/stat; a comm with spaces and ')' checks the parser.
	stat := fmt.Sprintf("%d (%s) %c %d %d %d 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 %d 1000000 200 18446744073709551615\n",
		p.pid, p.comm, state, p.ppid, p.pid, p.pid, start)
	must(t, os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644))
	ns := fmt.Sprint(p.pid)
	for _, n := range p.nspid {
		ns += fmt.Sprintf("\t%d", n)
	}
	status := fmt.Sprintf("Name:\t%s\nState:\t%c (sleeping)\nTgid:\t%d\nNgid:\t0\nPid:\t%d\nPPid:\t%d\nNSpid:\t%s\nCapEff:\t000001ffffffffff\n",
		p.comm, state, tgid, p.pid, p.ppid, ns)
	must(t, os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "comm"), []byte(p.comm+"\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "cmdline"), nul(p.argv), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "environ"), nul(p.env), 0o644))
	cg := p.cgroup
	if cg == "" {
		cg = "0::/user.slice/user-1000.slice/session-1.scope\n"
	}
	must(t, os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644))
	if p.exe != "" {
		must(t, os.Symlink(p.exe, filepath.Join(dir, "exe")))
	}
	if p.cwd != "" {
		must(t, os.Symlink(p.cwd, filepath.Join(dir, "cwd")))
	}
	for name, body := range p.files {
		path := filepath.Join(dir, "root", name)
		must(t, os.MkdirAll(filepath.Dir(path), 0o755))
		must(t, os.WriteFile(path, []byte(body), 0o644))
	}
}

func nul(ss []string) []byte {
	if len(ss) == 0 {
		return nil
	}
	return []byte(strings.Join(ss, "\x00") + "\x00")
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func writeTree(t testing.TB, root string, procs []fakeProc) {
	for _, p := range procs {
		p.write(t, root)
	}
}

// A Gym config dict as Gym passes it: server name -> type key -> implementation.
const gymDict = `simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      host: 127.0.0.1
      port: 12001
      resources_server:
        type: resources_servers
        name: weather
      model_server:
        type: responses_api_models
        name: policy_model
policy_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_api_key: sk-not-a-real-key
weather:
  resources_servers:
    example_weather:
      entrypoint: app.py
      domain: agent
head_server:
  host: 127.0.0.1
  port: 11000
`

func gymEnv(name string, extra ...string) []string {
	env := []string{"PATH=/usr/bin:/bin", "HOME=/root", EnvConfigPath + "=" + name, EnvConfigDict + "=" + gymDict}
	return append(env, extra...)
}

const (
	dockerID = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899"
	crioID   = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"
	podmanID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	k8sID    = "feedfacecafebeef0000111122223333444455556666777788889999aaaabbbb"
	podUID   = "5c2f3e1a-7b9d-4c1e-8f00-123456789abc"
)

// hostSpecs is the committed testdata/proc tree: one host running a Gym stack
// on the host, in docker, in podman, in cri-o and in a Kubernetes pod.
var hostSpecs = []fakeProc{
	{pid: 1, ppid: 0, comm: "systemd", argv: []string{"/sbin/init"}, exe: "/usr/lib/systemd/systemd"},
	// Gym's `bash -c "... python app.py"` wrapper: Gym env, but not a server.
	{pid: 100, ppid: 1, comm: "bash", argv: []string{"bash", "-c", "cd responses_api_agents/simple_agent && python app.py"},
		env: gymEnv("simple_agent"), exe: "/usr/bin/bash", cwd: "/gym"},
	{pid: 101, ppid: 100, comm: "python", argv: []string{"/gym/responses_api_agents/simple_agent/.venv/bin/python", "app.py"},
		env: gymEnv("simple_agent"), exe: "/usr/bin/python3.13", cwd: "/gym/responses_api_agents/simple_agent"},
	// A thread of 101: /proc/TID resolves to the process.
	{pid: 105, tgid: 101, ppid: 100, comm: "python", argv: []string{"python", "app.py"}, env: gymEnv("simple_agent"), exe: "/usr/bin/python3.13"},
	// uvicorn worker (num_workers > 1), spawned with Gym's worker flag.
	{pid: 102, ppid: 101, comm: "python", argv: []string{"/gym/.venv/bin/python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)", "--multiprocessing-fork"},
		env: gymEnv("simple_agent", EnvWorker+"=1"), exe: "/usr/bin/python3.13"},
	// multiprocessing's resource tracker inherits the env but serves nothing.
	{pid: 103, ppid: 101, comm: "python", argv: []string{"/gym/.venv/bin/python", "-c", "from multiprocessing.resource_tracker import main;main(4)"},
		env: gymEnv("simple_agent"), exe: "/usr/bin/python3.13"},
	// A spawned worker whose env was replaced: identity from its Gym parent.
	{pid: 104, ppid: 101, comm: "python3", argv: []string{"python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=9)", "--multiprocessing-fork"},
		env: []string{"PATH=/usr/bin"}, exe: "/usr/bin/python3.13"},
	// Model server in a docker container (cgroup v1, its own PID namespace).
	{pid: 110, ppid: 1, nspid: []int{1}, comm: "python", argv: []string{"python", "responses_api_models/openai_model/app.py"},
		env: gymEnv("policy_model"), exe: "/usr/local/bin/python3.13",
		cgroup: "12:pids:/docker/" + dockerID + "\n11:memory:/docker/" + dockerID + "\n0::/system.slice/containerd.service\n"},
	// Resources server in a Kubernetes pod (cgroup v2, systemd driver, containerd).
	{pid: 120, ppid: 1, nspid: []int{7}, comm: "python3.13", argv: []string{"python3.13", "app.py"},
		env:    gymEnv("weather", "HOSTNAME=gym-weather-0", "KUBERNETES_SERVICE_HOST=10.96.0.1"),
		exe:    "/usr/bin/python3.13",
		cgroup: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(podUID, "-", "_") + ".slice/cri-containerd-" + k8sID + ".scope\n",
		files:  map[string]string{"var/run/secrets/kubernetes.io/serviceaccount/namespace": "gym-runs"}},
	// Collectors, recognised by their command lines (a shebang script's argv).
	{pid: 130, ppid: 1, comm: "ng_collect_roll", argv: []string{"/gym/.venv/bin/python3", "/gym/.venv/bin/ng_collect_rollouts", "+agent_name=simple_agent", "+input_jsonl_fpath=data.jsonl"},
		exe: "/usr/bin/python3.13"},
	{pid: 131, ppid: 1, comm: "gym", argv: []string{"/usr/bin/python3", "/gym/.venv/bin/gym", "eval", "run", "--no-serve"}, exe: "/usr/bin/python3.13"},
	// Not Gym.
	{pid: 140, ppid: 1, comm: "python3", argv: []string{"python3", "-m", "http.server"}, env: []string{"PATH=/usr/bin"}, exe: "/usr/bin/python3.11"},
	// A docker sandbox started by the resources server inherits its env.
	{pid: 150, ppid: 120, comm: "docker", argv: []string{"docker", "exec", "sbx", "sh", "-c", "ls"}, env: gymEnv("weather"), exe: "/usr/bin/docker"},
	// Gym env without a config dict: the role comes from the entrypoint path.
	{pid: 160, ppid: 1, comm: "python", argv: []string{"python", "/gym/resources_servers/example_single_tool_call/app.py"},
		env: []string{EnvConfigPath + "=example_single_tool_call"}, exe: "/usr/bin/python3.12"},
	// podman (cgroup v2 systemd) and cri-o.
	{pid: 180, ppid: 1, nspid: []int{1}, comm: "python", argv: []string{"python", "app.py"},
		env: gymEnv("policy_model"), exe: "/usr/bin/python3",
		cgroup: "0::/machine.slice/libpod-" + podmanID + ".scope/container\n"},
	{pid: 181, ppid: 1, comm: "conmon", argv: []string{"/usr/bin/conmon"}, exe: "/usr/bin/conmon",
		cgroup: "0::/machine.slice/libpod-conmon-" + podmanID + ".scope\n"},
	{pid: 190, ppid: 1, nspid: []int{12}, comm: "python", argv: []string{"python", "app.py"},
		env: gymEnv("simple_agent"), exe: "/usr/bin/python3",
		cgroup: "0::/kubepods/besteffort/pod" + podUID + "/crio-" + crioID + ".scope\n"},
	// A zombie Gym server: still listed, already exited.
	{pid: 195, ppid: 1, comm: "python", state: 'Z', argv: nil, env: nil},
}

// TestGenerateTestdata rewrites testdata/proc with -update; otherwise checks
// that the committed tree still matches hostSpecs.
func TestGenerateTestdata(t *testing.T) {
	dir := filepath.Join("testdata", "proc")
	if *update {
		must(t, os.RemoveAll(dir))
		writeTree(t, dir, hostSpecs)
		return
	}
	tmp := t.TempDir()
	writeTree(t, tmp, hostSpecs)
	want := listTree(t, tmp)
	got := listTree(t, dir)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("testdata/proc is stale: run `go test ./internal/discover -run TestGenerateTestdata -update`\n got %d entries, want %d", len(got), len(want))
	}
}

func listTree(t *testing.T, root string) []string {
	var out []string
	err := filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		entry := rel
		if info.Mode()&os.ModeSymlink != 0 {
			target, _ := os.Readlink(path)
			entry += " -> " + target
		} else if !info.IsDir() {
			b, _ := os.ReadFile(path)
			entry += " " + fmt.Sprint(len(b)) + " " + fmt.Sprintf("%x", b[:min(len(b), 16)])
		}
		out = append(out, entry)
		return nil
	})
	must(t, err)
	sort.Strings(out)
	return out
}
