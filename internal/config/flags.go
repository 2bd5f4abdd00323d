package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// flagValue collects one flag's raw values; --pid may repeat.
type flagValue struct {
	name   string
	isBool bool
	vals   []string
}

func (f *flagValue) String() string     { return strings.Join(f.vals, ",") }
func (f *flagValue) Set(s string) error { f.vals = append(f.vals, s); return nil }
func (f *flagValue) IsBoolFlag() bool   { return f.isBool }

// NewFlagSet returns the flag set of `gymtrace run` with every setting.
// Values are collected raw and interpreted by Load, so a flag is validated
// with the same code as its env var and YAML key.
func NewFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for _, s := range settings {
		fs.Var(&flagValue{name: s.Flag, isBool: s.IsBool}, s.Flag, s.Usage)
	}
	fs.Usage = func() {}
	return fs
}

func parseFlags(args []string) (map[string]value, []string, error) {
	fs := NewFlagSet("gymtrace")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, flag.ErrHelp
		}
		return nil, nil, fmt.Errorf("%v (see gymtrace --help)", err)
	}
	out := map[string]value{}
	fs.Visit(func(f *flag.Flag) {
		fv := f.Value.(*flagValue)
		v := fv.vals[len(fv.vals)-1]
		if fv.name == "pid" {
			v = strings.Join(fv.vals, ",")
		}
		out[fv.name] = value{s: v, src: "flag --" + fv.name}
	})
	return out, fs.Args(), nil
}

// WriteFlagHelp prints the settings as `--help` shows them.
func WriteFlagHelp(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, s := range settings {
		arg := " VALUE"
		if s.IsBool {
			arg = "[=BOOL]"
		}
		def := ""
		if s.Default != "" {
			def = " (default: " + s.Default + ")"
		}
		fmt.Fprintf(tw, "  --%s%s\t%s%s\n", s.Flag, arg, s.Usage, def)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "\nEvery flag is also the env var GYMTRACE_<FLAG> (e.g. GYMTRACE_SPAN_GROUPS) and the key <flag> in snake_case\n"+
		"under `gymtrace:` in the --config file. Precedence: flags > env > file > defaults.")
	return err
}
