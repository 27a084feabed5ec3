//! Arbitrary bytes into both ends of iperf3's control protocol
//! (`proto::iperf3`), in arbitrary pieces, with the engine's calls
//! interleaved: no panic, no buffering past the length bound, and the
//! parameters check never panics on whatever parses. The same run feeds
//! arbitrary datagrams to the UDP side: the setup-datagram check and the
//! datagram header in both widths (a header read back writes the same
//! bytes).

use arbitrary::Arbitrary;
use longhaul_proto::iperf3::{
    is_udp_connect_reply, udp_connect_order, udp_connect_reply, udp_header_len, Client,
    ClientEvent, Cookie, Params, Results, Server, ServerEvent, ServerLimits, UdpHeader,
};

#[derive(Arbitrary, Debug)]
enum Step {
    Bytes(Vec<u8>),
    Accept,
    Refuse(i32),
    Start,
    Terminate,
    EndTest,
    SendResults,
}

#[derive(Arbitrary, Debug)]
struct Input {
    cookie: Vec<u8>,
    server: Vec<Step>,
    client: Vec<Step>,
    datagrams: Vec<Vec<u8>>,
}

fuzz_target!(|input: Input| {
    let _ = Cookie::parse(&input.cookie);
    for d in &input.datagrams {
        if let Some(order) = udp_connect_order(d) {
            assert_eq!(d.len(), 4);
            assert!(is_udp_connect_reply(&udp_connect_reply(order)));
        }
        let _ = is_udp_connect_reply(d);
        for wide in [false, true] {
            match UdpHeader::read(d, wide) {
                Some(h) => {
                    let _ = h.sent_ns();
                    let mut back = vec![0u8; udp_header_len(wide)];
                    assert!(h.write(&mut back, wide));
                    assert_eq!(&back[..], &d[..udp_header_len(wide)]);
                }
                None => assert!(d.len() < udp_header_len(wide)),
            }
        }
    }
    let limits = ServerLimits {
        max_streams: 16,
        max_seconds: 60,
        max_rate_bps: Some(1_000_000_000),
        max_len: 8 << 20,
        congestion: vec!["cubic".into()],
    };
    let mut s = Server::new();
    for step in input.server {
        match step {
            Step::Bytes(b) => {
                if s.receive(&b).is_err() {
                    break;
                }
            }
            Step::Accept => s.accept(),
            Step::Refuse(c) => s.refuse(c),
            Step::Start => s.start(),
            Step::Terminate => s.terminate(),
            Step::EndTest => {}
            Step::SendResults => s.send_results(&Results::default()),
        }
        while let Some(ev) = s.poll_event() {
            if let ServerEvent::Params(p) = ev {
                let _ = p.check(&limits);
            }
        }
        let _ = s.take_transmit();
    }
    let mut c = Client::new(&Cookie::from_random([1; 36]), &Params::default());
    for step in input.client {
        match step {
            Step::Bytes(b) if c.receive(&b).is_err() => break,
            Step::EndTest => c.end_test(),
            Step::SendResults => c.send_results(&Results::default()),
            Step::Terminate => c.terminate(),
            _ => {}
        }
        while let Some(ev) = c.poll_event() {
            if let ClientEvent::ServerResults(r) = ev {
                assert!(r.streams.len() <= longhaul_proto::iperf3::MAX_RESULT_STREAMS);
            }
        }
        let _ = c.take_transmit();
    }
});
