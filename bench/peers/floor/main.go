// Command floor is the bench's floor peer: the barest forwarder this
// module's fasthttp can make — each request handed to one HostClient and
// its response handed back, nothing else. No proxy built on this stack
// does less, so Sturdy ÷ floor is what Sturdy's features cost. It buffers
// whole replies (a stream arrives at once at its end): for streams nginx is
// the reference.
//
//	go run ./bench/peers/floor -listen 127.0.0.1:18085 -upstream 127.0.0.1:18000
package main

import (
	"flag"
	"log"

	"github.com/valyala/fasthttp"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:18085", "address to serve on")
	upstream := flag.String("upstream", "127.0.0.1:18000", "host:port to forward to")
	flag.Parse()
	// A request that failed (say, on a keep-alive connection the upstream
	// had just closed) is sent once more, as nginx does (proxy_next_upstream
	// error), not up to fasthttp's default five times.
	c := &fasthttp.HostClient{Addr: *upstream, MaxConns: 4096,
		RetryIfErr: func(_ *fasthttp.Request, attempts int, _ error) (bool, bool) { return false, attempts < 2 }}
	log.Fatal(fasthttp.ListenAndServe(*listen, func(ctx *fasthttp.RequestCtx) {
		if err := c.Do(&ctx.Request, &ctx.Response); err != nil {
			ctx.Error(err.Error(), fasthttp.StatusBadGateway)
		}
	}))
}
