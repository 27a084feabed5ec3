//! `wan up` for people: the hosts it made, what the link carried.

use longhaul_engine::results::WanHosts;
use longhaul_engine::wan::LinkStats;

/// `wan up` ready: its two hosts and how to reach them.
pub(super) fn print_wan_up(h: &WanHosts) {
    outln!(
        "host a {} (netns {}), host b {} (netns {}); `longhaul wan exec a -- CMD` runs CMD in a; Ctrl-C ends",
        h.a, h.ns_a, h.b, h.ns_b
    );
}

/// `wan up` ending: what the link carried each way, to stderr.
pub fn print_wan_down(ab: &LinkStats, ba: &LinkStats) {
    errln!(
        "longhaul: link down. a->b: {} packets, {} lost, {} queue drops, {} outage drops; b->a: {} packets, {} lost, {} queue drops, {} outage drops",
        ab.packets, ab.lost, ab.queue_drops, ab.outage_drops,
        ba.packets, ba.lost, ba.queue_drops, ba.outage_drops
    );
}
