"""The program's loop over a schedule's steps, compiled as the simulator's loop is (vp.schedule.kernel.jit: numba
from kernel.COMPILE_FROM actions on); vp/schedule/program.py prepares its shapes.

A step is its shape (the rank's (kind, chunk): program.py classifies each once) and its microbatch; per step the
loop finds the steps of its rank whose ends it waits for (the latest step of each needed shape at its microbatch;
none yet: the step is _MISSING), its channel (one per link table and microbatch, numbered in the order met) and
the collective instances it enters and waits on (one per instance table and microbatch, made in the order met from
the prototype that meets it first), and writes the program's flat arrays (program._Program).

Shapes (arrays indexed by shape id): code, time (index in time_keys; for a _SYNC step its duration), mem, mode,
p2p (index in p2p_keys), chan (its link's channel table), link (its link: one direction and kind of traffic
between two ranks), entry (the instance table it enters, -1: none) and entry_proto, at_end, is_coll; the shapes
it needs are shape_needs[nstart[s]:nstart[s + 1]]; the instances it waits on wait_tab / wait_proto[wstart[s]:
wstart[s + 1]].
"""
import numpy as np

from vp.schedule.kernel import MISSING, PLAIN, RECV, SEND, SYNC, kernel


@kernel
def derive(off, kc, mbs, m, code_of, time_of, mem_of, mode_of, p2p_of, chan_of, link_of, entry_of, entry_proto,
           at_end_of, is_coll_of, nstart, shape_needs, wstart, wait_tab, wait_proto, n_chan_tabs, n_inst_tabs,
           n_links, sbase):
    """(rec, needs, sync, waits, instances as (proto, mb), channels, missing, in_order, per shape its distinct
    microbatches, per rank its sends and receives, entries (step, instance) and their per-rank starts)."""
    pp, n, n_shapes = off.shape[0] - 1, kc.shape[0], code_of.shape[0]
    n_need, n_sync, n_wait = 0, 0, 0
    for g in range(n):
        s = kc[g]
        n_need += nstart[s + 1] - nstart[s]
        if code_of[s] == SYNC:
            n_sync += 1
            n_wait += wstart[s + 1] - wstart[s]
    rec = np.zeros((n, 6), np.int64)
    needs = np.empty(n_need, np.int64)
    sync = np.zeros((n_sync, 6), np.int64)
    waits = np.empty(n_wait, np.int64)
    width = 0
    for r in range(pp):
        width = max(width, sbase[r + 1] - sbase[r])
    done = np.full((width, m), -1, np.int64)  # the latest step of each of a rank's shapes at each microbatch
    seen = np.zeros(n_shapes, np.int64)  # distinct microbatches of each shape
    chans = np.full((n_chan_tabs, m), -1, np.int64)
    insts = np.full((n_inst_tabs, m), -1, np.int64)
    inst_proto, inst_mb = np.empty(n_sync + n_wait, np.int64), np.empty(n_sync + n_wait, np.int64)
    p2p_link, p2p_chan, p2p_recv = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.bool_)
    p2p_actions, entry_start = np.zeros(pp, np.int64), np.zeros(pp + 1, np.int64)
    entry_step, entry_inst = np.empty(n_sync, np.int64), np.empty(n_sync, np.int64)
    nn, ns, nw, n_inst, n_chan, n_p2p, n_entries = 0, 0, 0, 0, 0, 0, 0
    missing = False
    for r in range(pp):
        base, first = off[r], sbase[r]
        for g in range(base, off[r + 1]):
            i, s, mb = g - base, kc[g], mbs[g]
            code = code_of[s]
            n0, ok = nn, True
            for k in range(nstart[s], nstart[s + 1]):
                j = done[shape_needs[k] - first, mb]
                if j < 0:
                    ok = False
                    break
                if j != i - 1:  # the step just before ends at the rank's clock, which every step waits for
                    needs[nn] = j
                    nn += 1
            if not ok:
                nn = n0
            if done[s - first, mb] < 0:
                seen[s] += 1
            done[s - first, mb] = i
            if code == PLAIN:
                if ok:
                    rec[g, 0], rec[g, 1], rec[g, 2], rec[g, 3], rec[g, 4], rec[g, 5] = PLAIN, time_of[s], mem_of[s], mode_of[s], n0, nn
                else:
                    rec[g, 0], rec[g, 1] = MISSING, -1
                    missing = True
            elif code == SEND or code == RECV:
                p2p_actions[r] += 1
                if not ok and code == SEND:  # raised when the rank gets there
                    rec[g, 0], rec[g, 1] = MISSING, -1
                    missing = True
                    continue
                c = chans[chan_of[s], mb]
                if c < 0:
                    c = chans[chan_of[s], mb] = n_chan
                    n_chan += 1
                if not ok:  # a receive still waits for its send first
                    rec[g, 0], rec[g, 1] = MISSING, c
                    missing = True
                    continue
                rec[g, 0], rec[g, 1], rec[g, 4], rec[g, 5] = code, c, n0, nn
                if code == RECV:
                    rec[g, 2] = p2p_of[s]
                p2p_link[n_p2p], p2p_chan[n_p2p], p2p_recv[n_p2p] = link_of[s], c, code == RECV
                n_p2p += 1
            else:  # SYNC
                if not ok:
                    rec[g, 0], rec[g, 1] = MISSING, -1
                    missing = True
                    continue
                entry = -1
                if entry_of[s] >= 0:
                    entry = insts[entry_of[s], mb]
                    if entry < 0:
                        entry = insts[entry_of[s], mb] = n_inst
                        inst_proto[n_inst], inst_mb[n_inst] = entry_proto[s], mb
                        n_inst += 1
                    if not missing:
                        entry_step[n_entries], entry_inst[n_entries] = i, entry
                        n_entries += 1
                w0 = nw
                for k in range(wstart[s], wstart[s + 1]):
                    w = insts[wait_tab[k], mb]
                    if w < 0:
                        w = insts[wait_tab[k], mb] = n_inst
                        inst_proto[n_inst], inst_mb[n_inst] = wait_proto[k], mb
                        n_inst += 1
                    waits[nw] = w
                    nw += 1
                sync[ns, 0], sync[ns, 1], sync[ns, 2], sync[ns, 3] = entry, at_end_of[s], is_coll_of[s], time_of[s]
                sync[ns, 4], sync[ns, 5] = w0, nw
                rec[g, 0], rec[g, 1], rec[g, 2], rec[g, 3], rec[g, 4], rec[g, 5] = SYNC, ns, mem_of[s], mode_of[s], n0, nn
                ns += 1
        entry_start[r + 1] = n_entries
        done[:sbase[r + 1] - first] = -1
    return (rec, needs[:nn], sync[:ns], waits[:nw], inst_proto[:n_inst], inst_mb[:n_inst], n_chan, missing,
            _in_order(p2p_link[:n_p2p], p2p_chan[:n_p2p], p2p_recv[:n_p2p], n_links), seen, p2p_actions,
            entry_step[:n_entries], entry_inst[:n_entries], entry_start)


@kernel
def _in_order(link, chan, recv, n_links):
    """Whether each link receives exactly the channels it sends, in the order sent (steps in the ranks' order)."""
    sent, got = np.zeros(n_links + 1, np.int64), np.zeros(n_links + 1, np.int64)
    for k in range(link.shape[0]):
        if recv[k]:
            got[link[k] + 1] += 1
        else:
            sent[link[k] + 1] += 1
    for x in range(n_links):
        if sent[x + 1] != got[x + 1]:
            return False
        sent[x + 1] += sent[x]
    order_sent, order_got = np.empty(sent[n_links], np.int64), np.empty(sent[n_links], np.int64)
    put_sent, put_got = sent[:n_links].copy(), sent[:n_links].copy()
    for k in range(link.shape[0]):
        x = link[k]
        if recv[k]:
            order_got[put_got[x]] = chan[k]
            put_got[x] += 1
        else:
            order_sent[put_sent[x]] = chan[k]
            put_sent[x] += 1
    for k in range(order_sent.shape[0]):
        if order_sent[k] != order_got[k]:
            return False
    return True
