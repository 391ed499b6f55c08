// Package robustness is Shoal's Jepsen-style fault suite, after etcd's
// tests/robustness: a real deployment (catalog voters, object hosts and an
// edge, each a shoal process in its own network namespace), traffic that
// records every call and return (traffic), typed failpoints acting on real
// processes and links (failpoint), checkers of what users rely on and
// porcupine models (validate, model), and a report of every failing run
// (report). The scenarios are its tests; see README.md.
package robustness
