"""Topologies, routing, back-pressure, conservation and determinism of the fabric model."""

import itertools

import pytest
import simpy

from farpool.sim.fabric import (FatTree, Fabric, LinkParams, Mesh, Packet, Ring, Switch,
                                make_topology)
from farpool.sim.nodes import PoissonSource, spawn_streams


def test_ring_routes_go_one_way():
    r = Ring(4)
    assert r.route(0, 3) == (0, 1, 2)
    assert r.route(3, 0) == (3,)
    assert r.route(2, 2) == ()
    assert r.mean_hops() == pytest.approx(2.0)


@pytest.mark.parametrize("dims", [(4,), (3, 5), (4, 4), (3, 3, 3)])
def test_mesh_routes_are_manhattan_and_follow_links(dims):
    m = Mesh(dims)
    n = m.n_endpoints
    for s, d in itertools.product(range(n), range(n)):
        route = m.route(s, d)
        assert len(route) == sum(abs(a - b) for a, b in zip(m.coords(s), m.coords(d)))
        cur = s
        for link in route:
            src, dst, _ = m.links[link]
            assert src == cur
            cur = dst
        assert cur == d
    brute = sum(len(m.route(s, d)) for s in range(n) for d in range(n) if s != d)
    assert m.mean_hops() == pytest.approx(brute / (n * (n - 1)))


def test_torus_takes_the_short_way_round():
    t = Mesh((8, 8), torus=True)
    assert len(t.route(0, 7)) == 1  # wrap-around
    assert len(t.route(0, 4)) == 4
    n = t.n_endpoints
    brute = sum(len(t.route(s, d)) for s in range(n) for d in range(n) if s != d)
    assert t.mean_hops() == pytest.approx(brute / (n * (n - 1)))
    assert t.wraps and not Mesh((8, 8)).wraps


def test_mesh_mean_hops_closed_form_16x16():
    # (k^2 - 1) / (3k) per dimension over all pairs including self, rescaled to distinct pairs
    assert Mesh((16, 16)).mean_hops() == pytest.approx(2 * 255 / 48 * 256 / 255)


def test_fat_tree_and_switch_hops():
    f = FatTree(16, hosts_per_leaf=4)
    assert len(f.route(0, 1)) == 2
    assert len(f.route(0, 15)) == 4
    assert Switch(5).route(1, 3) == (1, 5 + 3)


def test_make_topology_rejects_bad_specs():
    assert make_topology("mesh:6x6x6").n_endpoints == 216
    assert make_topology("fattree:64:8").leaves == 8
    for bad in ("ring:1", "mesh:4xa", "blob:3", "fattree:8"):
        with pytest.raises(ValueError, match="bad topology spec"):
            make_topology(bad)


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="policy"):
        LinkParams(bandwidth=1.0, policy="lossy")
    with pytest.raises(ValueError, match="bandwidth"):
        LinkParams(bandwidth=0)
    with pytest.raises(ValueError, match="size"):
        Packet(0, 1, 0)


def flood(topo, params, n_per_src, seed, rate=0.05):
    """Every endpoint sends ``n_per_src`` packets to random others; returns the fabric and
    the sets of delivered and dropped packet ids."""
    env = simpy.Environment()
    delivered, dropped = [], []
    fab = Fabric(env, topo, params, on_drop=lambda p: dropped.append(p.pid))
    n = topo.n_endpoints
    for e in range(n):
        fab.attach(e, lambda p: delivered.append(p.pid))
    streams = spawn_streams(seed, n)
    for e in range(n):
        s = streams[e]

        def emit(e=e, s=s):
            d = s.below(n - 1)
            d += d >= e
            fab.send(Packet(e, d, 64 + 64 * s.below(4), vc=s.below(params.vcs)))
        PoissonSource(env, rate, s, emit, n_per_src)
    env.run()
    return fab, delivered, dropped


@pytest.mark.parametrize("spec,policy,vcs", [
    ("switch:8", "drop", 1), ("fattree:16:4", "drop", 2), ("mesh:4x4", "drop", 1),
    ("torus:4x4", "credit", 2), ("ring:6", "credit", 1), ("fattree:16:4:2", "credit", 2),
    ("mesh:3x3x3", "credit", 1)])
def test_conservation_under_overload(spec, policy, vcs):
    """Offered far beyond capacity: every packet is delivered or counted dropped, once."""
    topo = make_topology(spec)
    params = LinkParams(bandwidth=1.0, prop_ns=2, hop_ns=5, buffer_pkts=2, policy=policy,
                        vcs=vcs)
    fab, delivered, dropped = flood(topo, params, 300, seed=3, rate=0.05)
    sent = 300 * topo.n_endpoints
    assert fab.sent == sent
    assert fab.in_flight == 0
    assert len(delivered) + len(dropped) == sent
    assert len(set(delivered) | set(dropped)) == sent  # each exactly once
    if policy == "drop":
        assert dropped, "overload with 2-packet buffers should drop something"
        assert fab.dropped == len(dropped)
    else:
        assert not dropped  # credits never lose a packet ...
        assert max(fab.max_occ) <= 2  # ... and never overfill a buffer


def test_back_pressure_holds_the_sender():
    # One slow consumer link: with credits the 2-packet buffer bounds occupancy and the
    # upstream link idles while it waits; elastic buffers let the queue grow instead.
    topo = make_topology("fattree:4:2:1")
    credit, _, _ = flood(topo, LinkParams(bandwidth=1.0, buffer_pkts=2, policy="credit"),
                         200, seed=4, rate=0.5)
    elastic, _, _ = flood(topo, LinkParams(bandwidth=1.0, buffer_pkts=2, policy="elastic"),
                          200, seed=4, rate=0.5)
    assert max(credit.max_occ) <= 2
    assert credit.delivered == elastic.delivered == 800


def test_same_seed_same_run_different_seed_different_run():
    params = LinkParams(bandwidth=1.0, prop_ns=1, hop_ns=3, buffer_pkts=2, policy="credit",
                        vcs=2)

    def fingerprint(seed):
        fab, delivered, _ = flood(make_topology("torus:4x4"), params, 200, seed=seed)
        return delivered, fab.busy_ns, fab.env.now

    assert fingerprint(7) == fingerprint(7)
    assert fingerprint(7) != fingerprint(8)


def test_credit_ring_needs_room_for_a_bubble():
    env = simpy.Environment()
    with pytest.raises(ValueError, match="at least 2 packets"):
        Fabric(env, Ring(4), LinkParams(bandwidth=1.0, buffer_pkts=1, policy="credit"))
    Fabric(env, Mesh((4, 4)), LinkParams(bandwidth=1.0, buffer_pkts=1, policy="credit"))
