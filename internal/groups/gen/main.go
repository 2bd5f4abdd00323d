// Command gen writes bpf/common/groups.h from the group table in
// internal/groups. Run it with `go generate ./internal/groups`.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"

	"github.com/gymtrace/gymtrace/internal/groups"
)

func main() {
	out := flag.String("o", "../../"+groups.HeaderPath, `header file to write ("-" prints it)`)
	flag.Parse()
	want := groups.CHeader()
	if *out == "-" {
		os.Stdout.Write(want)
		return
	}
	// Leave an up-to-date file untouched so its mtime does not trigger
	// needless BPF rebuilds.
	if have, err := os.ReadFile(*out); err == nil && bytes.Equal(have, want) {
		return
	}
	if err := os.WriteFile(*out, want, 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "gen: writing %s: %v\n", *out, err)
		os.Exit(1)
	}
}
