package discover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultInterval is how often a Watcher rescans /proc when none is given. Exec
// events find new servers at once; the rescan catches what events missed.
const DefaultInterval = 5 * time.Second

// WatcherOptions configures a Watcher.
type WatcherOptions struct {
	FS       *FS           // nil: Default (/proc)
	Interval time.Duration // rescan period; 0: DefaultInterval; negative: no periodic rescans
	PIDs     []int         // explicit targets (--pid): traced whether or not they look like Gym
	Discover bool          // also find Gym processes on their own
	// OnAdd and OnRemove run on the Watcher's goroutine, one at a time, in event
	// order (a reused PID's removal comes before its new process's addition).
	// They must not call back into the Watcher's Run.
	OnAdd    func(*Process)
	OnRemove func(*Process)
	Logger   *slog.Logger
}

// Watcher keeps the set of target processes current: periodic rescans plus
// the exec/fork/exit events the loader sees in the kernel.
type Watcher struct {
	fs       *FS
	interval time.Duration
	discover bool
	explicit map[int]uint64 // pid -> start time given at NewWatcher
	onAdd    func(*Process)
	onRemove func(*Process)
	log      *slog.Logger

	events   chan pidEvent
	overflow atomic.Bool
	wake     chan struct{}

	mu      sync.Mutex
	targets map[int]*Process
}

type pidEvent struct {
	exit bool
	pid  int
}

// NewWatcher checks the explicit PIDs now, so that a missing one is an error
// before anything is attached.
func NewWatcher(o WatcherOptions) (*Watcher, error) {
	w := &Watcher{
		fs:       o.FS,
		interval: o.Interval,
		discover: o.Discover,
		explicit: make(map[int]uint64),
		onAdd:    o.OnAdd,
		onRemove: o.OnRemove,
		log:      o.Logger,
		events:   make(chan pidEvent, 4096),
		wake:     make(chan struct{}, 1),
		targets:  make(map[int]*Process),
	}
	if w.fs == nil {
		w.fs = Default
	}
	if w.interval == 0 {
		w.interval = DefaultInterval
	}
	if w.log == nil {
		w.log = slog.Default()
	}
	w.log = w.log.With("component", "discover")
	var errs []error
	for _, pid := range o.PIDs {
		p, err := w.fs.Inspect(pid)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		w.explicit[p.PID] = p.StartTime
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if len(w.explicit) == 0 && !w.discover {
		return nil, errors.New("nothing to trace: give --pid or enable discovery")
	}
	return w, nil
}

// OnExec reports that pid called exec (or was created); it never blocks, so the
// loader's ring-buffer reader can call it. A full queue falls back to a rescan.
func (w *Watcher) OnExec(pid int) { w.post(pidEvent{pid: pid}) }

// OnFork reports a new process (fork/clone of a thread-group leader). A forked
// uvicorn worker keeps its parent's environment, so it is inspected like an exec.
func (w *Watcher) OnFork(pid int) { w.post(pidEvent{pid: pid}) }

// OnExit reports that process pid exited.
func (w *Watcher) OnExit(pid int) { w.post(pidEvent{pid: pid, exit: true}) }

// Rescan asks for a rescan as soon as possible.
func (w *Watcher) Rescan() {
	w.overflow.Store(true)
	w.poke()
}

func (w *Watcher) post(e pidEvent) {
	select {
	case w.events <- e:
	default:
		w.Rescan()
	}
}

func (w *Watcher) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Targets returns a copy of the current targets, sorted by PID.
func (w *Watcher) Targets() []*Process {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]*Process, 0, len(w.targets))
	for _, p := range w.targets {
		cp := *p
		out = append(out, &cp)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out
}

// Sync brings the target set up to date with /proc once. Run calls it first,
// then on every tick; callers that do not run the loop can call it themselves.
func (w *Watcher) Sync() error {
	found := make(map[int]*Process)
	if w.discover {
		procs, err := w.fs.Scan()
		if err != nil {
			return err
		}
		for _, p := range procs {
			found[p.PID] = p
		}
	}
	for pid, start := range w.explicit {
		if _, ok := found[pid]; ok {
			continue
		}
		p, err := w.fs.Inspect(pid)
		if err != nil || p.StartTime != start {
			continue // gone, or its PID now names another process
		}
		found[pid] = p
	}
	w.mu.Lock()
	var gone []*Process
	for pid, p := range w.targets {
		if np, ok := found[pid]; !ok || np.StartTime != p.StartTime || identityChanged(p, np) {
			gone = append(gone, p)
		}
	}
	w.mu.Unlock()
	for _, p := range gone {
		w.remove(p)
	}
	pids := make([]int, 0, len(found))
	for pid := range found {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	for _, pid := range pids {
		w.add(found[pid])
	}
	return nil
}

// Run syncs, then follows events and periodic rescans until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	if err := w.Sync(); err != nil {
		return fmt.Errorf("discovering Gym processes: %w", err)
	}
	var tick <-chan time.Time
	if w.interval > 0 {
		t := time.NewTicker(w.interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-w.events:
			w.handle(e)
		case <-w.wake:
		case <-tick:
			w.overflow.Store(true)
		}
		if w.overflow.Swap(false) {
			if err := w.Sync(); err != nil {
				w.log.Warn("rescan failed; keeping the current targets", "err", err)
			}
		}
	}
}

func (w *Watcher) handle(e pidEvent) {
	w.mu.Lock()
	cur := w.targets[e.pid]
	w.mu.Unlock()
	if e.exit {
		// Exit events arrive per thread; only a process that is really gone (or a
		// zombie) leaves the target set.
		if cur != nil && !w.fs.alive(e.pid, cur.StartTime) {
			w.remove(cur)
		}
		return
	}
	var (
		p     *Process
		match bool
		err   error
	)
	if start, ok := w.explicit[e.pid]; ok {
		p, err = w.fs.Inspect(e.pid)
		match = err == nil && p.StartTime == start
	} else if w.discover {
		p, match, err = w.fs.match(e.pid)
	} else {
		return
	}
	if err != nil {
		if cur != nil && errors.Is(err, ErrNoProcess) {
			w.remove(cur)
		}
		return
	}
	if cur != nil && (!match || cur.StartTime != p.StartTime || identityChanged(cur, p)) {
		// exec into something else, or a reused PID whose exit we missed.
		w.remove(cur)
	}
	if match {
		w.add(p)
	}
}

func identityChanged(a, b *Process) bool {
	return a.ServerName != b.ServerName || a.Role != b.Role || a.Comm != b.Comm && b.Comm != ""
}

func (w *Watcher) add(p *Process) {
	w.mu.Lock()
	if cur, ok := w.targets[p.PID]; ok && cur.StartTime == p.StartTime {
		w.mu.Unlock()
		return
	}
	w.targets[p.PID] = p
	w.mu.Unlock()
	w.log.Info("target added", "pid", p.PID, "nspid", p.NSPID, "server", p.ServerName,
		"type", p.ServerType(), "worker", p.Worker, "container", shortID(p.ContainerID))
	if w.onAdd != nil {
		cp := *p
		w.onAdd(&cp)
	}
}

func (w *Watcher) remove(p *Process) {
	w.mu.Lock()
	cur, ok := w.targets[p.PID]
	if !ok || cur.StartTime != p.StartTime {
		w.mu.Unlock()
		return
	}
	delete(w.targets, p.PID)
	w.mu.Unlock()
	w.log.Info("target removed", "pid", p.PID, "server", p.ServerName)
	if w.onRemove != nil {
		cp := *p
		w.onRemove(&cp)
	}
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// alive tells whether pid still names the process that started at start and
// has not exited (a zombie has).
func (f *FS) alive(pid int, start uint64) bool {
	b, err := os.ReadFile(f.path(pid, "stat"))
	if err != nil {
		return false
	}
	var p Process
	if parseStat(b, &p) != nil || p.StartTime != start {
		return false
	}
	end := strings.LastIndexByte(string(b), ')')
	if end < 0 || end+3 > len(b) {
		return false
	}
	state := b[end+2]
	return state != 'Z' && state != 'X' && state != 'x'
}
