//! The connection layer: a byte stream (TLS over TCP, or plain TCP when
//! both ends allow it; see [`crate::net::tls`]) and framed message I/O over it,
//! with the read time-outs that keep a slow or silent peer from holding a
//! thread forever.

use std::any::Any;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use longhaul_proto::frame::{Decoder, Frame, HEADER_LEN, MAGIC, MAX_FRAME_BODY};
use longhaul_proto::msg::Message;
use longhaul_proto::ProtoError;

use crate::EngineError;

/// A byte stream that carries a session or a data stream. Implemented by
/// `TcpStream` (plaintext) and [`crate::net::tls::Tls`], which delegates
/// [`Stream::tcp`] to its socket (options, TCP_INFO, shutdown). `Any`, so
/// that the layers above TLS ([`crate::net::sealed::into_sealed`]) find the TLS
/// session under a stream without this layer knowing them.
pub trait Stream: Any + Read + Write + Send {
    fn tcp(&self) -> &TcpStream;

    /// Ends our sending side cleanly: TLS close_notify, then a TCP FIN.
    fn close_write(&mut self) -> io::Result<()> {
        self.tcp().shutdown(std::net::Shutdown::Write)
    }

    fn is_tls(&self) -> bool {
        false
    }

    /// Whether bytes the socket no longer shows are held here, read
    /// already and not yet returned (TLS: records, or their plaintext).
    fn pending(&mut self) -> bool {
        false
    }

    /// The fingerprint of the certificate the peer presented, if any.
    fn peer_fingerprint(&self) -> Option<String> {
        None
    }

    /// `TLS1.3 <cipher suite>`, or `none` for plaintext.
    fn encryption(&self) -> String {
        "none".into()
    }

    /// Writes all of `buf`, which it may overwrite: sealed frames encrypt
    /// a large piece in place and send it from there, with no copy into a
    /// frame buffer (the piece's plaintext is gone after the call).
    fn write_all_scratch(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.write_all(buf)
    }

    /// The plain socket, for zero-copy paths; TLS streams give themselves back.
    fn into_plain(self: Box<Self>) -> Result<TcpStream, Box<dyn Stream>>;
}

impl Stream for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }

    fn into_plain(self: Box<Self>) -> Result<TcpStream, Box<dyn Stream>> {
        Ok(*self)
    }
}

/// A second handle on the socket under a stream, to shut it down from
/// another thread while a worker owns the stream.
pub fn socket_of(s: &dyn Stream) -> Result<TcpStream, EngineError> {
    s.tcp()
        .try_clone()
        .map_err(|e| EngineError::io("failed to clone a data stream".into(), e))
}

/// An error that only means "not now": a time-out, or a signal.
pub(crate) fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Largest control frame we accept before the handshake is done.
pub const HANDSHAKE_MAX_FRAME: u32 = 64 << 10;

/// Framed message I/O on one stream.
pub struct FramedConn {
    stream: Box<dyn Stream>,
    decoder: Decoder,
    buf: Vec<u8>,
    /// Frames queued by [`FramedConn::queue`], not yet written.
    out: Vec<u8>,
    peer: String,
    eof: bool,
}

impl FramedConn {
    /// Wraps a stream whose preamble (if any) was already handled.
    pub fn new(stream: Box<dyn Stream>, peer: String) -> Self {
        Self {
            stream,
            decoder: Decoder::new(MAX_FRAME_BODY),
            buf: vec![0; 64 << 10],
            out: Vec::new(),
            peer,
            eof: false,
        }
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    pub fn tcp(&self) -> &TcpStream {
        self.stream.tcp()
    }

    /// See [`Stream::is_tls`].
    pub fn is_tls(&self) -> bool {
        self.stream.is_tls()
    }

    /// The fingerprint of the certificate the peer presented in TLS.
    pub fn peer_fingerprint(&self) -> Option<String> {
        self.stream.peer_fingerprint()
    }

    /// See [`Stream::encryption`].
    pub fn encryption(&self) -> String {
        self.stream.encryption()
    }

    /// Sends a message now (with any queued before it).
    pub fn send(&mut self, m: &Message) -> Result<(), EngineError> {
        m.encode(&mut self.out)?;
        self.flush_queued()
    }

    /// Queues a message to go out with the next [`FramedConn::send`] or
    /// [`FramedConn::flush_queued`]: many small messages, one write.
    pub fn queue(&mut self, m: &Message) -> Result<(), EngineError> {
        m.encode(&mut self.out)?;
        if self.out.len() >= 256 << 10 {
            self.flush_queued()?;
        }
        Ok(())
    }

    /// Writes the queued messages.
    pub fn flush_queued(&mut self) -> Result<(), EngineError> {
        if self.out.is_empty() {
            return Ok(());
        }
        let r = self
            .stream
            .write_all(&self.out)
            .and_then(|()| self.stream.flush());
        self.out.clear();
        r.map_err(|e| EngineError::io(format!("failed to send to {}", self.peer), e))
    }

    /// Waits up to `wait` for the next message. `Ok(None)` means nothing
    /// arrived in time; a closed connection is an error.
    pub fn recv(&mut self, wait: Duration) -> Result<Option<Message>, EngineError> {
        if let Some(f) = self.decoder.next_frame()? {
            return Ok(Some(Message::decode(&f)?));
        }
        if self.eof {
            return Err(EngineError::Closed(self.peer.clone()));
        }
        let wait = wait.max(Duration::from_millis(1));
        self.stream.tcp().set_read_timeout(Some(wait)).ok();
        match self.stream.read(&mut self.buf) {
            Ok(0) => {
                self.eof = true;
                Err(EngineError::Closed(self.peer.clone()))
            }
            Ok(n) => {
                self.decoder.push(&self.buf[..n]);
                match self.decoder.next_frame()? {
                    Some(f) => Ok(Some(Message::decode(&f)?)),
                    None => Ok(None),
                }
            }
            Err(e) if transient(&e) => Ok(None),
            Err(e) => Err(EngineError::io(
                format!("failed to read from {}", self.peer),
                e,
            )),
        }
    }

    /// The next message if it is here already, buffered or readable on the
    /// socket, without waiting for one (a message partly here waits for
    /// its rest as [`FramedConn::recv`] does, up to 1 ms).
    pub fn try_recv(&mut self) -> Result<Option<Message>, EngineError> {
        if let Some(f) = self.decoder.next_frame()? {
            return Ok(Some(Message::decode(&f)?));
        }
        let readable = self.eof || self.stream.pending() || {
            let mut fds = [rustix::event::PollFd::new(
                self.stream.tcp(),
                rustix::event::PollFlags::IN,
            )];
            rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default()))
                .map_or(true, |n| n > 0)
        };
        if !readable {
            return Ok(None);
        }
        self.recv(Duration::from_millis(1))
    }

    /// Waits until a message arrives or `deadline` passes.
    pub fn recv_until(&mut self, deadline: Instant) -> Result<Option<Message>, EngineError> {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            if let Some(m) = self.recv(deadline - now)? {
                return Ok(Some(m));
            }
        }
    }

    pub fn into_stream(self) -> Box<dyn Stream> {
        self.stream
    }
}

/// Reads exactly one frame, optionally after the preamble, consuming no
/// byte beyond it (the data that follows on a data stream is not ours).
pub fn read_one_frame(stream: &mut dyn Read, magic: bool, max: u32) -> Result<Frame, EngineError> {
    if magic {
        let mut m = [0u8; 8];
        stream.read_exact(&mut m).map_err(handshake_io)?;
        if m != MAGIC {
            return Err(ProtoError::BadMagic.into());
        }
    }
    let mut h = [0u8; HEADER_LEN];
    stream.read_exact(&mut h).map_err(handshake_io)?;
    let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    if len > max {
        return Err(ProtoError::FrameTooLarge {
            len: u64::from(len),
            max,
        }
        .into());
    }
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body).map_err(handshake_io)?;
    Ok(Frame { kind: h[4], body })
}

fn handshake_io(e: io::Error) -> EngineError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            EngineError::Timeout("handshake".into())
        }
        io::ErrorKind::UnexpectedEof => EngineError::Closed("peer during handshake".into()),
        _ => EngineError::io("failed to read the handshake".into(), e),
    }
}

/// Resolves `HOST[:PORT]`, `[v6]:PORT` or a bare IPv6 address.
pub fn resolve(target: &str, default_port: u16) -> Result<Vec<SocketAddr>, EngineError> {
    let with_port = if target.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{target}]:{default_port}")
    } else if target.starts_with('[') && target.ends_with(']') {
        format!("{target}:{default_port}")
    } else if target
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.contains(':') && p.parse::<u16>().is_ok())
        || target.contains("]:")
    {
        target.to_string()
    } else {
        format!("{target}:{default_port}")
    };
    let addrs: Vec<SocketAddr> = with_port
        .to_socket_addrs()
        .map_err(|e| EngineError::Connect(format!("cannot resolve '{target}': {e}")))?
        .collect();
    if addrs.is_empty() {
        return Err(EngineError::Connect(format!(
            "'{target}' resolves to no address"
        )));
    }
    Ok(addrs)
}

/// Connects with a time-out, trying each address in turn, always
/// directly ([`super::back::connect`] takes a connect-back route in force).
pub(crate) fn connect_direct(
    addrs: &[SocketAddr],
    timeout: Duration,
    tune: impl Fn(&socket2::Socket) -> io::Result<()>,
) -> Result<TcpStream, EngineError> {
    let mut last = None;
    for addr in addrs {
        let sock = socket2::Socket::new(
            socket2::Domain::for_address(*addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .map_err(|e| EngineError::io("failed to create a socket".into(), e))?;
        tune(&sock).map_err(|e| EngineError::Usage(e.to_string()))?;
        match sock.connect_timeout(&(*addr).into(), timeout) {
            Ok(()) => return Ok(sock.into()),
            Err(e) => last = Some((addr, e)),
        }
    }
    let (addr, e) = last.expect("at least one address");
    let hint = match e.kind() {
        io::ErrorKind::ConnectionRefused => "is `longhaul serve` running there, on that port?",
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
            "no answer: check the host, its firewall and the route"
        }
        _ => "check the address and the network",
    };
    Err(EngineError::Connect(format!(
        "cannot connect to {addr}: {e} ({hint})"
    )))
}
