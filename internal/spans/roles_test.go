//go:build linux

package spans

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// A collector given by pid without a role is the orchestrator once it sends
// POST /run: its gym.job exists and its resource says so.
func TestOrchestratorByBehaviour(t *testing.T) {
	s := newSim(t, "default")
	s.procs[pidCollector] = &discover.Process{PID: pidCollector, Comm: "python3"} // --pid, no =ROLE
	s.traced[pidCollector] = true
	g := newGymStack(s, false)
	for i := 0; i < 3; i++ {
		g.rollout(i, 1, int32(i))
	}
	s.proc(loader.EvProcExit, pidCollector, 0)
	want := []string{e(jobSpan, "")}
	for i := 0; i < 3; i++ {
		want = append(want, jobTree()...)
	}
	diffEdges(t, edges(t, s.spans), want)
	for _, sp := range s.spans {
		if sp.Proc.PID == pidCollector && sp.Proc.ServiceName() != "nemo-gym/orchestrator" {
			t.Errorf("%s: service %s, want nemo-gym/orchestrator", desc(sp), sp.Proc.ServiceName())
		}
	}
	if s.procs[pidCollector].Role != loader.RoleUnknown {
		t.Error("discovery's Process was written")
	}
	if got := s.b.InferredRole(pidCollector); got != groups.RoleOrchestrator {
		t.Errorf("inferred %v, want orchestrator", got)
	}
}

// The same collector whose exit discovery sees first: the agent forgets the
// process (ForgetProcess, from discovery's goroutine) before the reader hands
// the Builder the kernel's exit record that ends the job. The gym.job keeps
// the role its process had when the job began (e2e TestRolesByBehaviour
// once exported it as nemo-gym/python3).
func TestOrchestratorJobForgottenBeforeExit(t *testing.T) {
	s := newSim(t, "default")
	s.procs[pidCollector] = &discover.Process{PID: pidCollector, Comm: "python3"} // --pid, no =ROLE
	s.traced[pidCollector] = true
	g := newGymStack(s, false)
	g.rollout(0, 1, 0)
	s.b.ForgetProcess(pidCollector)
	s.proc(loader.EvProcExit, pidCollector, 0)
	jobs := findSpans(s.spans, "gym.job")
	if len(jobs) != 1 {
		t.Fatalf("%d gym.job spans, want 1", len(jobs))
	}
	if got := jobs[0].Proc.ServiceName(); got != "nemo-gym/orchestrator" {
		t.Errorf("gym.job: service %s, want nemo-gym/orchestrator", got)
	}
	if s.procs[pidCollector].Role != loader.RoleUnknown {
		t.Error("discovery's Process was written")
	}
}

// A model server that serves only /v1/responses (with and without the
// rollout prefix), found without its role, is a model server because an
// agent calls it: every request is named the same way and has its
// gym.model.responses, the first one included, whichever side's record
// comes first.
func TestModelByCaller(t *testing.T) {
	for _, late := range []bool{false, true} {
		s := newSim(t, "per_rollout")
		s.procs[pidModel] = &discover.Process{PID: pidModel, ServerName: "policy_model"} // no role
		s.lateCli = late
		g := newGymStack(s, false)
		for i := 0; i < 4; i++ {
			run := g.collAgent[i].request(loader.MethodPOST, "/run")
			g.agentMod[i].request(loader.MethodPOST, "/ng-rollout/ro-1/v1/responses").respond(200)
			g.agentMod[i].request(loader.MethodPOST, "/v1/responses").respond(200)
			run.respond(200)
		}
		names := map[string]int{}
		for _, sp := range s.spans {
			if sp.Proc.PID == pidModel {
				names[sp.Name]++
				if sp.Proc.Role != loader.RoleModel {
					t.Errorf("late=%v %s: resource role %d, want model", late, sp.Name, sp.Proc.Role)
				}
			}
		}
		if names["POST /v1/responses"] != 8 || names["gym.model.responses"] != 8 || len(names) != 2 {
			t.Errorf("late=%v: model spans %v, want 8 POST /v1/responses and 8 gym.model.responses", late, names)
		}
		for _, sp := range findSpans(s.spans, "gym.model.responses") {
			if p := findByID(s.spans, sp.Parent); p == nil || p.Name != "POST /v1/responses" {
				t.Errorf("late=%v: gym.model.responses not under its server span", late)
			}
		}
		if st := s.b.Stats(); st.GymSpanUnresolved != 0 || st.RoleUndecided != 0 {
			t.Errorf("late=%v: unresolved %d, undecided %d", late, st.GymSpanUnresolved, st.RoleUndecided)
		}
	}
}

// Attached mid-run, nothing is known yet: the model's first requests come
// from a process not yet seen serving /run. They are held, then named as the
// later ones once the agent shows itself and calls the model again.
func TestHeldUntilRoleDecided(t *testing.T) {
	s := newSim(t, "per_rollout")
	s.procs = map[uint32]*discover.Process{} // discovery knows nothing
	mod := s.dial(pidAgent, pidModel, modelAddr)
	mod.request(loader.MethodPOST, "/ng-rollout/ro-0/v1/responses").respond(200) // before the agent is known
	mod.request(loader.MethodPOST, "/ng-rollout/ro-0/v1/responses").respond(200)
	for _, sp := range s.spans {
		if sp.Proc.PID == pidModel {
			t.Fatalf("%s returned before the model's role was known, want it held", sp.Name)
		}
	}
	run := s.dial(pidCollector, pidAgent, agentAddr).request(loader.MethodPOST, "/run")
	mod.request(loader.MethodPOST, "/ng-rollout/ro-1/v1/responses").respond(200)
	run.respond(200)
	names := map[string]int{}
	for _, sp := range s.spans {
		if sp.Proc.PID == pidModel {
			names[sp.Name]++
		}
	}
	if names["POST /v1/responses"] != 3 || names["gym.model.responses"] != 3 || len(names) != 2 {
		t.Errorf("model spans %v, want 3 POST /v1/responses and 3 gym.model.responses", names)
	}
	if st := s.b.Stats(); st.Held == 0 || st.RoleUndecided != 0 || st.GymSpanUnresolved != 0 {
		t.Errorf("held %d, undecided %d, unresolved %d", st.Held, st.RoleUndecided, st.GymSpanUnresolved)
	}
}

// A provisional gym.* span that the role decides away leaves its children
// under the server span; one it confirms keeps them.
func TestProvisionalGymSpan(t *testing.T) {
	for _, tc := range []struct {
		decide func(s *sim)
		want   []string
	}{
		{ // the process turns out to be the agent: gym.agent.responses
			decide: func(s *sim) {
				s.dial(pidCollector, pidAgent, agentAddr).request(loader.MethodPOST, "/run").respond(200)
			},
			want: []string{
				e(":POST /v1/responses", ""), e(":gym.agent.responses", ":POST /v1/responses"),
				e(":HTTP POST ->model/v1/chat/completions", ":gym.agent.responses"),
				e(":POST /run", ""), e(":gym.rollout", ":POST /run"),
			},
		},
		{ // never decided: route shape only, no gym.* span
			decide: func(*sim) {},
			want: []string{
				e(":POST /v1/responses", ""),
				e(":HTTP POST ->model/v1/chat/completions", ":POST /v1/responses"),
			},
		},
	} {
		s := newSim(t, "per_rollout")
		s.procs = map[uint32]*discover.Process{}
		s.traced = map[uint32]bool{pidAgent: true}
		resp := s.dial(pidCollector, pidAgent, agentAddr).request(loader.MethodPOST, "/v1/responses")
		s.dial(pidAgent, pidModel, modelAddr).request(loader.MethodPOST, "/v1/chat/completions").respond(200)
		resp.respond(200)
		tc.decide(s)
		s.spans = append(s.spans, s.p.Flush()...)
		diffEdges(t, edges(t, s.spans), tc.want)
	}
}

// Past the bound (holdMaxSpans) spans are named by route shape and counted;
// a decision after that names the later ones by the role.
func TestHoldBoundBySpans(t *testing.T) {
	s := newSim(t, "server")
	s.procs = map[uint32]*discover.Process{}
	s.traced = map[uint32]bool{pidModel: true}
	c := s.dial(pidAgent, pidModel, modelAddr)
	for i := 0; i < holdMaxSpans+10; i++ {
		c.request(loader.MethodPOST, "/ng-rollout/ro-1/v1/responses").respond(200)
	}
	st := s.b.Stats()
	if len(s.spans) != holdMaxSpans+10 || st.RoleUndecided != holdMaxSpans+10 {
		t.Fatalf("%d spans, %d undecided; want %d of each", len(s.spans), st.RoleUndecided, holdMaxSpans+10)
	}
	for _, sp := range s.spans {
		if sp.Name != "POST /ng-rollout/{rollout_id}/v1/responses" {
			t.Fatalf("span %q, want the route-shape name", sp.Name)
		}
	}
}

// A process that serves no route any kind of Gym server has (any non-Gym
// server, a tool route) is never held: its names cannot depend on a role.
func TestNonGymRoutesNotHeld(t *testing.T) {
	s := newSim(t, "server,http_client")
	s.procs = map[uint32]*discover.Process{}
	s.traced = map[uint32]bool{pidModel: true, pidAgent: true}
	c := s.dial(pidAgent, pidModel, modelAddr)
	c.request(loader.MethodPOST, "/get_weather").respond(200)
	c.request(loader.MethodGET, "/healthz/x").respond(200)
	if len(s.spans) != 4 {
		t.Fatalf("%d spans, want the 4 at once (2 SERVER, 2 CLIENT)", len(s.spans))
	}
	if st := s.b.Stats(); st.Held != 0 {
		t.Errorf("%d spans held", st.Held)
	}
}

// Held spans wait at most holdMaxAge.
func TestHoldBoundByAge(t *testing.T) {
	clk := &stepClock{Clock: http.NewClockWithOffset(0)}
	s := newSim(t, "server")
	s.b.opt.Clock = clk
	s.procs = map[uint32]*discover.Process{}
	s.traced = map[uint32]bool{pidModel: true}
	s.dial(pidAgent, pidModel, modelAddr).request(loader.MethodPOST, "/v1/responses").respond(200)
	if len(s.spans) != 0 {
		t.Fatal("span not held")
	}
	clk.add(holdMaxAge - time.Millisecond)
	if got := s.p.Expire(clk.NowMono()); len(got) != 0 {
		t.Fatal("released before holdMaxAge")
	}
	clk.add(time.Millisecond)
	got := s.p.Expire(clk.NowMono())
	if len(got) != 1 || got[0].Name != "POST /v1/responses" {
		t.Fatalf("after holdMaxAge: %v", got)
	}
	if st := s.b.Stats(); st.RoleUndecided != 1 {
		t.Errorf("RoleUndecided = %d, want 1", st.RoleUndecided)
	}
}

type stepClock struct {
	Clock
	off atomic.Int64
}

func (c *stepClock) NowMono() uint64     { return c.Clock.NowMono() + uint64(c.off.Load()) }
func (c *stepClock) add(d time.Duration) { c.off.Add(int64(d)) }

func findByID(spans []Span, id [8]byte) *Span {
	for i := range spans {
		if spans[i].SpanID == id {
			return &spans[i]
		}
	}
	return nil
}
