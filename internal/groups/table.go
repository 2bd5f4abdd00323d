package groups

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable prints the groups and presets for `gymtrace --help`.
func WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tSPANS\tEMITTED BY")
	for _, in := range table {
		spans := strings.Join(in.Spans, ", ")
		if spans == "" {
			spans = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", in.Name, spans, in.EmittedBy)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "PRESET\tGROUPS\tUSE WHEN")
	for _, p := range presets {
		gs := strings.Join(p.Mask.Names(), ", ")
		if p.Mask == AllGroups {
			gs = "every group, including sandbox and startup"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Name, gs, p.UseWhen)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "\n"+StartupNote)
	return err
}
