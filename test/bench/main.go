// Command benchserver is the small compiled HTTP/1.1 server that scripts/bench
// points wrk at, so gymtrace's userspace side can be driven at rates a Python
// server cannot reach on two cores. It answers every request with a short
// fixed JSON body on a keep-alive connection and does nothing else: the cost
// being measured is gymtrace's, not the server's.
//
//	benchserver [--listen 127.0.0.1:0]
//
// The first line on stdout, once the socket is bound, is "listening HOST:PORT".
// SIGINT/SIGTERM stop it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

var body = []byte(`{"ok":true}` + "\n")

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on; port 0 picks a free one")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchserver: listening on %s: %v (choose another --listen)\n", *listen, err)
		os.Exit(1)
	}
	fmt.Printf("listening %s\n", ln.Addr())

	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", fmt.Sprint(len(body)))
		w.Write(body)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 60 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("benchserver stopped", "err", err)
		os.Exit(1)
	}
}
