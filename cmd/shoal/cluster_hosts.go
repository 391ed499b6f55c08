package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/raftmeta"
)

// hostView is one object host as `shoal cluster status` shows it: the
// catalog's row and, when the host answered, its own status (alarms held
// destructive verdicts, see objecthost/orphans.go).
type hostView struct {
	ID        string                 `json:"id"`
	Address   string                 `json:"address"`
	Region    string                 `json:"region"`
	Reachable bool                   `json:"reachable"`
	Error     string                 `json:"error,omitempty"`
	Status    *objecthost.HostStatus `json:"status,omitempty"`
}

// objectHostStatuses lists the hosts the catalog node at addr knows and asks
// each for its status (2 s each, in parallel). A failure to list is shown as
// no hosts: the catalog part of the status is what the command is for.
func objectHostStatuses(ctx context.Context, addr string, tlsL *pki.Loader) []hostView {
	cl, err := raftmeta.NewClient([]string{addr}, raftmeta.WithCacheTTL(0), raftmeta.WithRetries(2, 50*time.Millisecond, 200*time.Millisecond), raftmeta.WithTLS(tlsL))
	if err != nil {
		return nil
	}
	defer cl.Close()
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	hosts, err := cl.Hosts(lctx, raftmeta.StaleRead())
	cancel()
	if err != nil {
		return nil
	}
	out := make([]hostView, len(hosts))
	hc := &http.Client{Timeout: 2 * time.Second, Transport: tlsL.Transport(&http.Transport{}, pki.RoleHost)}
	var wg sync.WaitGroup
	for i, h := range hosts {
		out[i] = hostView{ID: h.ID, Address: h.Address, Region: h.Region}
		wg.Add(1)
		go func(v *hostView) {
			defer wg.Done()
			st, err := fetchHostStatus(ctx, hc, tlsL.Scheme()+"://"+v.Address)
			if err != nil {
				v.Error = err.Error()
				return
			}
			v.Reachable, v.Status = true, st
		}(&out[i])
	}
	wg.Wait()
	return out
}

func fetchHostStatus(ctx context.Context, hc *http.Client, base string) (*objecthost.HostStatus, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/status", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var env struct {
		Result  objecthost.HostStatus `json:"result"`
		Success bool                  `json:"success"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&env); err != nil || !env.Success {
		return nil, fmt.Errorf("status %s: not an object host answer", resp.Status)
	}
	return &env.Result, nil
}

func printHosts(out io.Writer, hosts []hostView) {
	if len(hosts) == 0 {
		return
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tADDR\tREGION\tACTIVE\tDELETED\tALARMS")
	var alarms []string
	for _, h := range hosts {
		if h.Status == nil {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\tunreachable\n", h.ID, h.Address, h.Region)
			continue
		}
		kinds := []string{}
		for _, a := range h.Status.Alarms {
			kinds = append(kinds, a.Kind)
			alarms = append(alarms, fmt.Sprintf("ALARM %s %s: %s (sample %s; last seen %s)", h.ID, a.Kind, a.Message,
				strings.Join(a.Sample, ","), a.LastSeen.UTC().Format(time.RFC3339)))
		}
		state := "none"
		if len(kinds) > 0 {
			state = strings.Join(kinds, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", h.ID, h.Address, h.Region, h.Status.Active, h.Status.Deleted, state)
	}
	tw.Flush()
	for _, a := range alarms {
		fmt.Fprintln(out, a)
	}
}
