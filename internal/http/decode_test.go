//go:build linux

package http

import (
	"errors"
	"math"
	"net/netip"
	"testing"

	"github.com/gymtrace/gymtrace/internal/loader"
)

func sampleEvent() *loader.HTTPEvent {
	ev := &loader.HTTPEvent{
		Kind: loader.EvRequest, Side: loader.SideServer, Method: loader.MethodPOST,
		Role: loader.RoleAgent, Pid: 42, Tid: 43, ConnId: 7, StartNs: 100, EndNs: 200,
		Flags: loader.FlagHost | loader.FlagTraceparent | loader.FlagRollout,
	}
	ev.PathLen = uint16(copy(ev.Path[:], "/ng-rollout/r1/v1/responses"))
	ev.HostLen = uint16(copy(ev.Host[:], "127.0.0.1:8000"))
	copy(ev.Traceparent[:], "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	ev.Rollout.Task, ev.Rollout.Rollout, ev.Rollout.Attempt = 3, 5, -1
	la := netip.MustParseAddr("::ffff:127.0.0.1").As16()
	ra := netip.MustParseAddr("::1").As16()
	ev.Tuple.Laddr, ev.Tuple.Raddr = la, ra
	ev.Tuple.Lport, ev.Tuple.Rport = 8000, 51000
	return ev
}

func TestDecodeRoundTrip(t *testing.T) {
	in := sampleEvent()
	raw := Encode(in)
	if len(raw) != loader.HTTPEventSize {
		t.Fatalf("Encode: %d bytes, want %d", len(raw), loader.HTTPEventSize)
	}
	out, err := Decode(raw)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if *out != *in {
		t.Fatalf("round trip changed the event:\n got %+v\nwant %+v", out, in)
	}
	if got := PathOf(out); got != "/ng-rollout/r1/v1/responses" {
		t.Errorf("PathOf = %q", got)
	}
	if got := HostOf(out); got != "127.0.0.1:8000" {
		t.Errorf("HostOf = %q", got)
	}
	if got := TraceparentOf(out); got != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Errorf("TraceparentOf = %q", got)
	}
	l, r := Tuple(out)
	if l.String() != "127.0.0.1:8000" || r.String() != "[::1]:51000" {
		t.Errorf("Tuple = %v %v, want IPv4 unmapped and IPv6 kept", l, r)
	}
	if id := RolloutOf(out).GymID(); id != "3-5" {
		t.Errorf("rollout id = %q, want 3-5", id)
	}
	// Values the flags do not announce must not leak out.
	out.Flags = 0
	if HostOf(out) != "" || TraceparentOf(out) != "" || RolloutOf(out).Present {
		t.Errorf("unflagged fields were returned")
	}
}

func TestDecodeRejects(t *testing.T) {
	good := Encode(sampleEvent())
	cases := map[string]func(ev *loader.HTTPEvent){
		"kind":        func(ev *loader.HTTPEvent) { ev.Kind = 9 },
		"kind zero":   func(ev *loader.HTTPEvent) { ev.Kind = 0 },
		"side":        func(ev *loader.HTTPEvent) { ev.Side = 3 },
		"path len":    func(ev *loader.HTTPEvent) { ev.PathLen = uint16(pathMax + 1) },
		"host len":    func(ev *loader.HTTPEvent) { ev.HostLen = uint16(hostMax + 1) },
		"rollout len": func(ev *loader.HTTPEvent) { ev.Rollout.IdLen = uint16(rolloutIDMax + 1) },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			ev, _ := Decode(good)
			mutate(ev)
			_, err := Decode(Encode(ev))
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("Decode accepted a bad record (err=%v)", err)
			}
		})
	}
	if _, err := Decode(good[:len(good)-1]); err == nil {
		t.Fatal("Decode accepted a short record")
	}
	if _, err := Decode(nil); err == nil {
		t.Fatal("Decode accepted nil")
	}
}

func TestRolloutGymID(t *testing.T) {
	cases := []struct {
		r    Rollout
		want string
	}{
		{Rollout{Present: true, Task: 0, Index: 0, Attempt: -1}, "0-0"},
		{Rollout{Present: true, Task: 12, Index: 3, Attempt: 2}, "12-3-a2"},
		{Rollout{Present: true, Task: 12, Index: 3, Attempt: 0}, "12-3-a0"},
		{Rollout{Present: true, Task: 1, Index: 2, Attempt: 1, ID: "custom"}, "custom"},
		{Rollout{Present: true, Task: -1, Index: 2, Attempt: -1}, ""},
		{Rollout{Task: 1, Index: 2}, ""},
	}
	for _, c := range cases {
		if got := c.r.GymID(); got != c.want {
			t.Errorf("%+v.GymID() = %q, want %q", c.r, got, c.want)
		}
	}
}

func TestMethodName(t *testing.T) {
	if MethodName(loader.MethodPOST) != "POST" || MethodName(loader.MethodHEAD) != "HEAD" {
		t.Error("known methods misnamed")
	}
	if MethodName(loader.MethodUnknown) != "_OTHER" || MethodName(200) != "_OTHER" {
		t.Error("unknown methods must be _OTHER")
	}
}

// FuzzDecode: no input may panic, and whatever is accepted must give strings
// within the contract's bounds.
func FuzzDecode(f *testing.F) {
	f.Add(Encode(sampleEvent()))
	f.Add([]byte{})
	f.Add(make([]byte, loader.HTTPEventSize))
	f.Fuzz(func(t *testing.T, raw []byte) {
		ev, err := Decode(raw)
		if err != nil {
			if ev != nil {
				t.Fatal("Decode returned an event with an error")
			}
			return
		}
		if len(PathOf(ev)) > pathMax || len(HostOf(ev)) > hostMax || len(TraceparentOf(ev)) > traceparentLen {
			t.Fatal("a decoded string exceeds its bound")
		}
		_ = RolloutOf(ev).GymID()
		if v, ok := RewardOf(ev); ok && (math.IsInf(v, 0) || math.IsNaN(v)) {
			t.Fatalf("RewardOf returned %v", v)
		}
		_, _ = Tuple(ev)
		// Feeding any accepted record to an Assembler must not panic either.
		NewAssembler(AssemblerOptions{}).Add(ev, nopHandler{})
	})
}

type nopHandler struct{}

func (nopHandler) RequestStarted(*Exchange) {}
func (nopHandler) ExchangeDone(*Exchange)   {}

// Responses and closes travel as the record's fixed head; a reused event
// must not keep the request fields of the record decoded before.
func TestDecodeShortResponseRecord(t *testing.T) {
	ev := sampleEvent()
	if err := DecodeInto(ev, Encode(sampleEvent())); err != nil {
		t.Fatal(err)
	}
	resp := sampleEvent()
	resp.Kind, resp.Status = loader.EvResponse, 200
	raw := Encode(resp)[:loader.HTTPEventHeadSize]
	if err := DecodeInto(ev, raw); err != nil {
		t.Fatalf("short response record rejected: %v", err)
	}
	if ev.Kind != loader.EvResponse || ev.Status != 200 || ev.ConnId != 7 || ev.PathLen != 0 || ev.Path[0] != 0 ||
		ev.HostLen != 0 || ev.Traceparent[0] != 0 || ev.Rollout.Task != 0 {
		t.Errorf("short record decoded as %+v", ev)
	}
	req := Encode(sampleEvent())[:loader.HTTPEventHeadSize]
	if err := DecodeInto(ev, req); err == nil {
		t.Error("a request record cut to the head was accepted")
	}
	if err := DecodeInto(ev, raw[:loader.HTTPEventHeadSize-1]); err == nil {
		t.Error("a response record shorter than the head was accepted")
	}
}

func rewardEvent(text string) *loader.HTTPEvent {
	ev := &loader.HTTPEvent{Kind: loader.EvResponse, Side: loader.SideServer, ConnId: 7, Status: 200, Flags: loader.FlagReward}
	copy(ev.Reward[:], text)
	return ev
}

func TestRewardOf(t *testing.T) {
	cases := []struct {
		text string
		want float64
		ok   bool
	}{
		{"0.75", 0.75, true},
		{"-1.5e-3", -0.0015, true},
		{"2E+2", 200, true},
		{"1", 1, true},
		{"0", 0, true},
		{"-0.25", -0.25, true},
		{"-1.2345678901234567e-300", -1.2345678901234567e-300, true}, // all 24 bytes, no NUL
		// The kernel sends only JSON numbers; anything else is refused, not guessed.
		{"", 0, false},
		{"1e999", 0, false}, // out of float64's range
		{"Inf", 0, false},
		{"NaN", 0, false},
		{"0x1p-2", 0, false},
		{"01", 0, false},
		{"1.", 0, false},
		{".5", 0, false},
		{"+1", 0, false},
		{"1e", 0, false},
		{"--1", 0, false},
	}
	for _, c := range cases {
		got, ok := RewardOf(rewardEvent(c.text))
		if ok != c.ok || got != c.want {
			t.Errorf("RewardOf(%q) = %v, %v; want %v, %v", c.text, got, ok, c.want, c.ok)
		}
	}
	ev := rewardEvent("0.5")
	ev.Flags = 0
	if _, ok := RewardOf(ev); ok {
		t.Error("a reward without FlagReward was returned")
	}
	ev = rewardEvent("0.5")
	ev.Kind = loader.EvRequest
	if _, ok := RewardOf(ev); ok {
		t.Error("a request's reward was returned: only responses carry one")
	}
}

// A response with a reward travels as the head and the reward
// (GT_HTTP_EVENT_REWARD); a head alone has none, whatever its flags say.
func TestDecodeRewardRecord(t *testing.T) {
	ev := sampleEvent()
	raw := Encode(rewardEvent("-1.5e-3"))
	if err := DecodeInto(ev, raw[:loader.HTTPEventRewardSize]); err != nil {
		t.Fatalf("reward record rejected: %v", err)
	}
	if v, ok := RewardOf(ev); !ok || v != -0.0015 || ev.PathLen != 0 || ev.Rollout.Task != 0 {
		t.Errorf("reward record decoded as reward %v (%v), path %d, rollout %+v", v, ok, ev.PathLen, ev.Rollout)
	}
	if err := DecodeInto(ev, raw[:loader.HTTPEventHeadSize]); err != nil {
		t.Fatal(err)
	}
	if _, ok := RewardOf(ev); ok || ev.Flags&loader.FlagReward != 0 || ev.Reward[0] != 0 {
		t.Errorf("a head-only record kept a reward: flags %#x reward %q", ev.Flags, ev.Reward[:])
	}
}
