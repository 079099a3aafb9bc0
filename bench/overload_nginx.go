package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// olNginxConf is nginx in front of the fake GPU server with max_conns =
// the server's slots (the zone shares the count between its workers).
// Open-source nginx has no queue (that is NGINX Plus's `queue`): a
// request past max_conns gets 502 at once, which the scenarios' clients
// retry after 500 ms, as an SDK's first retry would.
const olNginxConf = `worker_processes 2;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log crit;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path %[1]s/tmp/body;
  proxy_temp_path %[1]s/tmp/proxy;
  fastcgi_temp_path %[1]s/tmp/fastcgi;
  uwsgi_temp_path %[1]s/tmp/uwsgi;
  scgi_temp_path %[1]s/tmp/scgi;
  upstream gpu {
    zone gpu 64k;
    server %[2]s max_conns=%[4]d max_fails=0;
    keepalive 256;
  }
  server {
    listen %[3]s;
    location / {
      proxy_pass http://gpu;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 120s;
    }
  }
}
`

// startNginx starts nginx on a free loopback port in front of the
// server at up with max_conns slots; its address, and how to stop it.
func startNginx(up string, slots int) (addr string, stop func(), err error) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		return "", nil, fmt.Errorf("nginx is not installed (apt-get install nginx-light)")
	}
	if addr, err = freeAddr(); err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "bench-nginx")
	if err != nil {
		return "", nil, err
	}
	_ = os.Chmod(dir, 0o755)
	conf := filepath.Join(dir, "nginx.conf")
	body := fmt.Sprintf(olNginxConf, dir, strings.TrimPrefix(up, "http://"), addr, slots)
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "-p", dir, "-c", conf)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	_, stop = stopper(cmd, dir)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return addr, stop, nil
		}
	}
	stop()
	return "", nil, fmt.Errorf("nginx did not listen on %s", addr)
}
