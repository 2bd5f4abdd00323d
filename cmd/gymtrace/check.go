package main

import (
	"context"
	"fmt"
	"io"

	"github.com/gymtrace/gymtrace/internal/config"
	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/inject"
	"github.com/gymtrace/gymtrace/internal/preflight"
)

// runCheck is `gymtrace check`: it prints, for this machine, each feature
// gymtrace uses as ok / mounted-by-gymtrace / missing with what to do, then the
// Gym processes it would trace. ok is false when a required feature is missing
// and could not be fixed; the command then exits non-zero. err is for failures
// of the command itself (its output could not be written).
func runCheck(ctx context.Context, cfg *config.Config, out io.Writer) (ok bool, err error) {
	_ = cfg // every check is about the machine; nothing in the config relaxes one
	rep := preflight.Run(ctx, preflight.Options{LoadPrograms: true, InjectSelfTest: func() (bool, string, error) {
		r, err := inject.SelfTest()
		return r.Safe(), r.String(), err
	}})
	if err := rep.WriteTable(out); err != nil {
		return false, fmt.Errorf("writing the check table: %w", err)
	}
	procs, scanErr := discover.Scan()
	switch {
	case scanErr != nil:
		_, err = fmt.Fprintf(out, "gym processes: cannot list them: %v\n", scanErr)
	case len(procs) == 0:
		_, err = fmt.Fprintln(out, "gym processes: none running now (gymtrace also finds servers started after it)")
	default:
		_, err = fmt.Fprintf(out, "gym processes: %d\n", len(procs))
		for _, p := range procs {
			if err != nil {
				break
			}
			where := "host"
			if p.ContainerID != "" {
				where = "container " + p.ContainerID[:min(12, len(p.ContainerID))]
			}
			_, err = fmt.Fprintf(out, "  pid %-7d %-40s %-22s %s\n", p.PID, p.ServiceName(), p.ServerType(), where)
		}
	}
	if err != nil {
		return false, fmt.Errorf("writing the check table: %w", err)
	}
	return rep.OK(), nil
}
