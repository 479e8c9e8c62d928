// Command kfake runs an in-process Kafka-protocol cluster (github.com/twmb/franz-go/pkg/kfake) as its own
// process, for tests and local runs where no Kafka broker is installed. It prints its listen addresses on
// the first line of stdout and serves until SIGINT or SIGTERM.
//
//	kfake [--brokers N] [--ports 9092,9093]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	brokers := flag.Int("brokers", 1, "number of brokers")
	ports := flag.String("ports", "", "comma-separated ports, one per broker (default: free ports)")
	flag.Parse()
	opts := []kfake.Opt{kfake.NumBrokers(*brokers)}
	if *ports != "" {
		var ps []int
		for p := range strings.SplitSeq(*ports, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil {
				fmt.Fprintf(os.Stderr, "kfake: --ports: %q is not a port\n", p)
				os.Exit(2)
			}
			ps = append(ps, n)
		}
		opts = append(opts, kfake.Ports(ps...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kfake:", err)
		os.Exit(1)
	}
	fmt.Printf("kfake listening on %s\n", strings.Join(c.ListenAddrs(), ","))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	c.Close()
}
