// Command mkimage writes gymtrace's container image as an OCI layout from
// prebuilt static binaries. scripts/build-image builds the binaries and runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gymtrace/gymtrace/test/deploy/image"
)

type binaries map[string]string

func (b binaries) String() string { return fmt.Sprint(map[string]string(b)) }

func (b binaries) Set(v string) error {
	arch, path, ok := strings.Cut(v, "=")
	if !ok || arch == "" || path == "" {
		return fmt.Errorf("want ARCH=PATH, got %q", v)
	}
	b[arch] = path
	return nil
}

func main() {
	bins := binaries{}
	o := image.Options{Binaries: bins}
	flag.Var(bins, "binary", "ARCH=PATH of a static linux binary (repeat per architecture)")
	flag.StringVar(&o.Out, "out", "dist/image", "OCI image layout directory to write (replaced)")
	flag.StringVar(&o.Tag, "tag", "gymtrace:dev", "image reference name")
	flag.StringVar(&o.CACerts, "ca", defaultCA(), "CA roots file to include at "+image.CAPath+" ('' for none)")
	flag.BoolVar(&o.Tarballs, "tarballs", true, "also write gymtrace-ARCH.tar for `docker load` / `podman load`")
	flag.StringVar(&o.Version, "version", "", "org.opencontainers.image.version label")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "mkimage: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	// SOURCE_DATE_EPOCH (reproducible-builds.org) sets the creation time.
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "mkimage: SOURCE_DATE_EPOCH=%q is not a number of seconds\n", s)
			os.Exit(2)
		}
		o.Created = time.Unix(sec, 0)
	}
	d, err := image.Build(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	fmt.Printf("%s %s %s\n", o.Out, o.Tag, d)
}

func defaultCA() string {
	const p = "/etc/ssl/certs/ca-certificates.crt"
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return ""
}
