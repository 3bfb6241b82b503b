package main

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/isolatord/isolatord/dataplane"
	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/isolator/dockerdriver"
)

// dockerNetworksFile is where the Docker driver keeps its networks, in the
// state directory.
const dockerNetworksFile = "docker-networks.json"

// serveDocker serves Docker's remote network driver on o.dockerPlugin
// (--docker-plugin; "" does nothing) until ctx ends or the returned
// func is called, which waits for it to have stopped.
func serveDocker(ctx context.Context, o *options, iso *isolator.Isolator, dp *dataplane.DataPlane, log *slog.Logger) (func(), error) {
	if o.dockerPlugin == "" {
		return func() {}, nil
	}
	drv, err := dockerdriver.New(iso, dp, filepath.Join(o.stateDir, dockerNetworksFile), log)
	if err != nil {
		return nil, err
	}
	lis, err := dockerdriver.Listen(o.dockerPlugin)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := drv.Serve(ctx, lis); err != nil {
			log.Error("docker plugin stopped", "socket", o.dockerPlugin, "err", err.Error())
		}
	}()
	log.Info("serving the Docker network driver", "socket", o.dockerPlugin)
	return func() { cancel(); <-done }, nil
}
