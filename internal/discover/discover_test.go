package discover

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func testFS() *FS { return &FS{Root: "testdata/proc", NodeName: "node-a"} }

func TestScanFindsGymProcesses(t *testing.T) {
	procs, err := testFS().Scan()
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		name        string
		role        uint8
		nspid       int
		worker      bool
		container   string
		pod, podUID string
		ns, node    string
	}
	wants := map[int]want{
		101: {name: "simple_agent", role: RoleAgent, nspid: 101},
		102: {name: "simple_agent", role: RoleAgent, nspid: 102, worker: true},
		104: {name: "simple_agent", role: RoleAgent, nspid: 104, worker: true},
		110: {name: "policy_model", role: RoleModel, nspid: 1, container: dockerID},
		120: {name: "weather", role: RoleResources, nspid: 7, container: k8sID, pod: "gym-weather-0", podUID: podUID, ns: "gym-runs", node: "node-a"},
		130: {name: "orchestrator", role: RoleOrchestrator, nspid: 130},
		131: {name: "orchestrator", role: RoleOrchestrator, nspid: 131},
		160: {name: "example_single_tool_call", role: RoleResources, nspid: 160},
		180: {name: "policy_model", role: RoleModel, nspid: 1, container: podmanID},
		190: {name: "simple_agent", role: RoleAgent, nspid: 12, container: crioID, podUID: podUID, node: "node-a"},
	}
	got := map[int]*Process{}
	for _, p := range procs {
		got[p.PID] = p
	}
	for pid := range got {
		if _, ok := wants[pid]; !ok {
			t.Errorf("pid %d (%s, %q) found but is not a Gym server", pid, got[pid].Comm, got[pid].ServerName)
		}
	}
	for pid, w := range wants {
		p := got[pid]
		if p == nil {
			t.Errorf("pid %d (%s) not found", pid, w.name)
			continue
		}
		if p.ServerName != w.name || p.Role != w.role || p.NSPID != w.nspid || p.Worker != w.worker ||
			p.ContainerID != w.container || p.K8sPodName != w.pod || p.K8sPodUID != w.podUID ||
			p.K8sNamespace != w.ns || p.K8sNodeName != w.node {
			t.Errorf("pid %d = %+v\nwant %+v", pid, *p, w)
		}
	}
	if p := got[101]; p != nil && (p.StartTime != 1101 || p.PPID != 100) {
		t.Errorf("pid 101 start/ppid = %d/%d, want 1101/100", p.StartTime, p.PPID)
	}
	if p := got[130]; p != nil && p.ServiceName() != "nemo-gym/orchestrator" {
		t.Errorf("collector service.name = %q", p.ServiceName())
	}
	if p := got[120]; p != nil && (p.ServiceName() != "nemo-gym/weather" || p.ServerType() != "resources_servers") {
		t.Errorf("pid 120 service %q type %q", p.ServiceName(), p.ServerType())
	}
}

func TestInspect(t *testing.T) {
	fs := testFS()
	p, err := fs.Inspect(105) // a thread id
	if err != nil {
		t.Fatal(err)
	}
	if p.PID != 101 || p.ServerName != "simple_agent" {
		t.Errorf("thread 105 resolved to pid %d %q, want 101 simple_agent", p.PID, p.ServerName)
	}
	// An explicit PID that is not Gym is still described.
	p, err = fs.Inspect(140)
	if err != nil || p.Role != RoleUnknown || p.ServerName != "" || p.Comm != "python3" {
		t.Errorf("Inspect(140) = %+v, %v", p, err)
	}
	_, err = fs.Inspect(4242)
	if !errors.Is(err, ErrNoProcess) || !strings.Contains(err.Error(), "process 4242 does not exist") {
		t.Errorf("Inspect(4242) error = %v", err)
	}
	if _, err := fs.Inspect(-3); err == nil || !strings.Contains(err.Error(), "not valid") {
		t.Errorf("Inspect(-3) error = %v", err)
	}
}

func TestRoleFromConfigShapes(t *testing.T) {
	cases := []struct {
		name, dict string
		want       uint8
	}{
		{"simple_agent", gymDict, RoleAgent},
		{"policy_model", gymDict, RoleModel},
		{"weather", gymDict, RoleResources},
		{"head_server", gymDict, RoleUnknown},
		{"missing", gymDict, RoleUnknown},
		// JSON is YAML too.
		{"m", `{"m": {"responses_api_models": {"vllm_model": {"entrypoint": "app.py"}}}}`, RoleModel},
		// The server's own block without its name.
		{"x", "resources_servers:\n  foo:\n    entrypoint: app.py\n", RoleResources},
		// A dotted name.
		{"envs.w", "envs:\n  w:\n    resources_servers:\n      w: {}\n", RoleResources},
		// The type key one level below an extra wrapper.
		{"a", "a:\n  config:\n    responses_api_agents:\n      simple_agent: {}\n", RoleAgent},
		// Double-encoded.
		{"a", `"a: {responses_api_agents: {x: {}}}"`, RoleAgent},
		{"a", "", RoleUnknown},
		{"a", "- not\n- a map\n", RoleUnknown},
		{"a", "a: [unclosed", RoleUnknown},
	}
	for _, c := range cases {
		if got := roleFromConfig(c.dict, c.name); got != c.want {
			t.Errorf("roleFromConfig(%q, %.40q) = %d, want %d", c.name, c.dict, got, c.want)
		}
	}
}

func TestRoleFromCommand(t *testing.T) {
	cases := []struct {
		argv []string
		cwd  string
		role uint8
		impl string
	}{
		{[]string{"/usr/bin/python3", "/v/bin/ng_e2e_collect_rollouts", "+x=1"}, "", RoleOrchestrator, ""},
		{[]string{"python", "-m", "gym", "eval", "run"}, "", RoleOrchestrator, ""},
		{[]string{"python", "/gym/bin/gym", "env", "start"}, "", RoleOrchestrator, ""},
		{[]string{"python", "gym", "--help"}, "", RoleUnknown, ""},
		{[]string{"python", "responses_api_models/vllm_model/app.py"}, "", RoleModel, "vllm_model"},
		{[]string{"python", "app.py"}, "/src/Gym/resources_servers/code_gen", RoleResources, "code_gen"},
		{[]string{"python", "app.py"}, "/src/Gym", RoleUnknown, ""},
		{[]string{"python", "/x/responses_api_agents/app.py"}, "", RoleUnknown, ""},
	}
	for _, c := range cases {
		role, impl := roleFromCommand(c.argv, c.cwd)
		if role != c.role || impl != c.impl {
			t.Errorf("roleFromCommand(%q, %q) = %d %q, want %d %q", c.argv, c.cwd, role, impl, c.role, c.impl)
		}
	}
}

func TestParseCgroup(t *testing.T) {
	cases := []struct{ in, id, pod string }{
		{"0::/user.slice/user-0.slice/session-3.scope\n", "", ""},
		{"0::/system.slice/docker-" + dockerID + ".scope\n", dockerID, ""},
		{"4:devices:/docker/" + dockerID + "\n1:name=systemd:/docker/" + dockerID + "\n", dockerID, ""},
		{"0::/kubepods/burstable/pod" + podUID + "/" + k8sID + "\n", k8sID, podUID},
		{"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + strings.ReplaceAll(podUID, "-", "_") + ".slice/cri-containerd-" + k8sID + ".scope\n", k8sID, podUID},
		{"0::/kubepods.slice/kubepods-pod" + strings.ReplaceAll(podUID, "-", "_") + ".slice/crio-" + crioID + ".scope\n", crioID, podUID},
		{"0::/machine.slice/libpod-" + podmanID + ".scope/container\n", podmanID, ""},
		{"0::/machine.slice/libpod-conmon-" + podmanID + ".scope\n", "", ""},
		{"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + podmanID + ".scope\n", podmanID, ""},
		// A pod-looking name outside kubepods is not a pod.
		{"0::/system.slice/pod" + podUID + ".service\n", "", ""},
		{"garbage", "", ""},
	}
	for _, c := range cases {
		id, pod := parseCgroup([]byte(c.in))
		if id != c.id || pod != c.pod {
			t.Errorf("parseCgroup(%q) = %q %q, want %q %q", c.in, id, pod, c.id, c.pod)
		}
	}
}

func TestParseStatCommWithParens(t *testing.T) {
	var p Process
	line := "77 (we ird) (x) S 5 77 77 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 987654 1000000 200 1\n"
	if err := parseStat([]byte(line), &p); err != nil {
		t.Fatal(err)
	}
	if p.Comm != "we ird) (x" || p.PPID != 5 || p.StartTime != 987654 {
		t.Errorf("got %+v", p)
	}
	if err := parseStat([]byte("77 (short) S 1"), &p); err == nil {
		t.Error("short stat parsed without error")
	}
}

func TestAlive(t *testing.T) {
	fs := testFS()
	if !fs.alive(101, 1101) {
		t.Error("101 should be alive")
	}
	if fs.alive(101, 999) {
		t.Error("101 with another start time is a reused PID, not alive")
	}
	if fs.alive(195, 1195) {
		t.Error("a zombie is not alive")
	}
	if fs.alive(4242, 1) {
		t.Error("a missing PID is not alive")
	}
}

func TestDescendsFrom(t *testing.T) {
	root := t.TempDir()
	stat := func(pid, ppid int) {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		line := fmt.Sprintf("%d (sh) S %d 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 100 0 0\n", pid, ppid)
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// 10 (orchestrator) -> 20 (sh) -> server 30; 40 is a child of 1.
	stat(10, 1)
	stat(20, 10)
	f := NewFS(root)
	server := &Process{PID: 30, PPID: 20}
	if !f.DescendsFrom(server, 10) {
		t.Error("a grandchild through a shell does not descend from its orchestrator")
	}
	if !f.DescendsFrom(&Process{PID: 21, PPID: 10}, 10) {
		t.Error("a child does not descend from its parent")
	}
	if f.DescendsFrom(&Process{PID: 40, PPID: 1}, 10) {
		t.Error("a child of init descends from 10")
	}
	if f.DescendsFrom(&Process{PID: 50, PPID: 99}, 10) {
		t.Error("a process whose parent is gone descends from 10")
	}
}
