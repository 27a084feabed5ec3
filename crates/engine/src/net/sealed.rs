//! Sealed frames: a data stream's bytes after its TLS handshake, sealed
//! with the AEAD of the stream's own TLS session under keys exported from
//! it (RFC 8446 section 7.5), in frames of up to 1 MiB (PROTOCOL.md 13.2b).
//!
//! Why: rustls copies every 16 KiB record into a buffer of its own on
//! send, and on receive reads 4 KiB at a time and copies the plaintext
//! twice more before the caller sees it. A sealed frame is encrypted in
//! the caller's buffer (a piece it lets us overwrite) or from it into a
//! frame buffer, and received into the caller's buffer and decrypted there
//! (aws-lc-rs), one record per piece of a chunk: one buffer's worth of
//! cache at each end, no copy of ours. TLS still authenticates both ends and
//! derives the keys; only the record layer of the data is ours, and it
//! uses nothing but the standard AEAD.
//!
//! Nonce discipline: each direction has its own secret (the exporter's 64
//! bytes: client to server, then server to client); frame `n` of a
//! direction is sealed under key `epoch = n >> 18` (HKDF-SHA256 of the
//! secret, info `longhaul sealed key` and the epoch) with the 96-bit nonce
//! `0^32 || n`. A key seals at most 2^18 frames of at most 1 MiB, 256 GiB,
//! within TLS 1.3's limit for AES-GCM; no (key, nonce) pair repeats. The
//! frame's 4-byte header is the AEAD's associated data, so a frame replayed,
//! dropped, reordered, cut or altered fails to open, and the stream ends
//! with an error; its clean end is a sealed close frame, so a cut stream is
//! an error, never a short success.

use crate::stages::{timed, Stage};
use std::any::Any;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::hkdf;

use super::conn::Stream;
use super::tls::Tls;

/// The exporter label both ends derive the secrets with.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-longhaul-sealed-frames-v1";
/// What the server sends in TLS, after the data stream's hello, as the last
/// TLS bytes of that direction: sealed frames follow.
pub const MARKER: &[u8; 8] = b"LHSEALD1";
/// The most plaintext one frame carries.
pub const MAX_FRAME: usize = 1 << 20;
/// Frames sealed under one key.
const FRAMES_PER_KEY: u64 = 1 << 18;
const HEADER: usize = 4;
const TAG: usize = 16;
/// Header bit: the sender's clean end (no payload follows).
const CLOSE: u32 = 1 << 31;
/// Why a frame did not open.
const FAILED: &str = "a frame failed authentication (altered, replayed, reordered or dropped)";
/// Small writes gather up to this much before they are sealed.
const GATHER: usize = 64 << 10;

/// A sealed frame that does not open, or does not parse.
fn broken(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("sealed data stream: {what}"),
    )
}

/// The keys of one direction: the exported secret, and the key of the
/// epoch the next frame is in.
pub struct Keys {
    alg: &'static aead::Algorithm,
    secret: [u8; 32],
    seq: u64,
    key: Option<(u64, LessSafeKey)>,
}

impl Keys {
    /// AES-128-GCM keys from `secret` (fuzzing, tests).
    pub fn aes_128_gcm(secret: [u8; 32]) -> Keys {
        Keys::new(&aead::AES_128_GCM, secret)
    }

    pub fn new(alg: &'static aead::Algorithm, secret: [u8; 32]) -> Keys {
        Keys {
            alg,
            secret,
            seq: 0,
            key: None,
        }
    }

    /// The next frame's key and nonce; each frame takes one.
    fn next(&mut self) -> io::Result<(&LessSafeKey, Nonce)> {
        let seq = self.seq;
        self.seq = seq
            .checked_add(1)
            .ok_or_else(|| broken("frame counter exhausted"))?;
        let epoch = seq / FRAMES_PER_KEY;
        if self.key.as_ref().is_none_or(|(e, _)| *e != epoch) {
            self.key = Some((epoch, epoch_key(self.alg, &self.secret, epoch)?));
        }
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&seq.to_be_bytes());
        let key = &self.key.as_ref().expect("set above").1;
        Ok((key, Nonce::assume_unique_for_key(nonce)))
    }

    /// Starts the counter at `seq` (tests of the epoch change).
    #[cfg(test)]
    fn at(mut self, seq: u64) -> Keys {
        self.seq = seq;
        self
    }
}

fn epoch_key(
    alg: &'static aead::Algorithm,
    secret: &[u8; 32],
    epoch: u64,
) -> io::Result<LessSafeKey> {
    let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, secret);
    let epoch = epoch.to_be_bytes();
    let info = [b"longhaul sealed key".as_slice(), &epoch];
    let okm = prk
        .expand(&info, alg)
        .map_err(|_| broken("key derivation failed"))?;
    Ok(LessSafeKey::new(UnboundKey::from(okm)))
}

fn header(len: usize, close: bool) -> [u8; HEADER] {
    (len as u32 | if close { CLOSE } else { 0 }).to_be_bytes()
}

/// Makes `buf` `len` bytes long, zeroing only what it never held: every
/// byte is written before it is read (a frame is sealed or read into it).
fn size(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0);
    }
    buf.truncate(len);
}

/// Seals `plain` (the frame's payload) into `out`, which becomes the whole
/// frame: header, ciphertext, tag.
pub fn seal(keys: &mut Keys, plain: &[u8], close: bool, out: &mut Vec<u8>) -> io::Result<()> {
    if plain.len() > MAX_FRAME || close && !plain.is_empty() {
        return Err(broken("a frame too large, or a close with a payload"));
    }
    let h = header(plain.len(), close);
    size(out, HEADER + plain.len() + TAG);
    out[..HEADER].copy_from_slice(&h);
    let (key, nonce) = keys.next()?;
    let (ct, tag) = out[HEADER..].split_at_mut(plain.len());
    key.seal_out_of_place_scatter(nonce, Aad::from(h), plain, ct, &[], tag)
        .map_err(|_| broken("sealing failed"))
}

/// Seals the frame whose payload is in place in `frame[HEADER..]` (the
/// header and tag are written here).
fn seal_in_place(keys: &mut Keys, frame: &mut Vec<u8>) -> io::Result<()> {
    let len = frame.len() - HEADER;
    let h = header(len, false);
    frame[..HEADER].copy_from_slice(&h);
    let (key, nonce) = keys.next()?;
    let tag = key
        .seal_in_place_separate_tag(nonce, Aad::from(h), &mut frame[HEADER..])
        .map_err(|_| broken("sealing failed"))?;
    frame.extend_from_slice(tag.as_ref());
    Ok(())
}

/// Seals `piece` (at most [`MAX_FRAME`], not empty) in place: the frame
/// is the header, the piece, then the tag, both returned.
fn seal_piece(keys: &mut Keys, piece: &mut [u8]) -> io::Result<([u8; HEADER], aead::Tag)> {
    if piece.len() > MAX_FRAME || piece.is_empty() {
        return Err(broken("a piece too large to seal in place, or empty"));
    }
    let h = header(piece.len(), false);
    let (key, nonce) = keys.next()?;
    let tag = key
        .seal_in_place_separate_tag(nonce, Aad::from(h), piece)
        .map_err(|_| broken("sealing failed"))?;
    Ok((h, tag))
}

/// A frame's header read: its payload length, or the close.
pub fn parse_header(h: [u8; HEADER]) -> io::Result<(usize, bool)> {
    let v = u32::from_be_bytes(h);
    let (len, close) = ((v & !CLOSE) as usize, v & CLOSE != 0);
    if len > MAX_FRAME {
        return Err(broken(format!(
            "a frame of {len} bytes (at most {MAX_FRAME})"
        )));
    }
    if close && len != 0 {
        return Err(broken("a close frame with a payload"));
    }
    Ok((len, close))
}

/// Opens a whole frame's ciphertext and tag (`body`) into `out`, whose
/// length is the payload's.
pub fn open(keys: &mut Keys, h: [u8; HEADER], body: &[u8], out: &mut [u8]) -> io::Result<()> {
    let (ct, tag) = body.split_at(body.len() - TAG);
    let (key, nonce) = keys.next()?;
    key.open_separate_gather(nonce, Aad::from(h), ct, tag, out)
        .map_err(|_| broken(FAILED))
}

/// The exported secrets of a TLS data stream, (sending, receiving) for
/// this end, and the AEAD its TLS session chose.
fn secrets(tls: &Tls) -> io::Result<(Keys, Keys)> {
    let mut both = [0u8; 64];
    tls.export(EXPORTER_LABEL, &mut both)
        .map_err(|e| broken(format!("no keys from the TLS session: {e}")))?;
    let alg = tls.aead();
    let mut c2s = [0u8; 32];
    let mut s2c = [0u8; 32];
    c2s.copy_from_slice(&both[..32]);
    s2c.copy_from_slice(&both[32..]);
    let (c2s, s2c) = (Keys::new(alg, c2s), Keys::new(alg, s2c));
    Ok(if tls.is_client() {
        (c2s, s2c)
    } else {
        (s2c, c2s)
    })
}

/// The receiving half: frames read from any byte source, opened in turn.
pub struct Opener {
    keys: Keys,
    /// The frame being read: header, then ciphertext and tag.
    hdr: [u8; HEADER],
    hdr_have: usize,
    body: Vec<u8>,
    body_have: usize,
    /// A frame opened here (the caller's buffer was smaller): its
    /// plaintext not yet returned is `body[plain.0..plain.1]`.
    plain: (usize, usize),
    closed: bool,
}

/// Fills `buf[*have..]` from `src`; false at its end. What was read stays
/// counted in `have` when an error (a time-out) breaks off.
fn read_into(src: &mut impl Read, buf: &mut [u8], have: &mut usize) -> io::Result<bool> {
    while *have < buf.len() {
        match src.read(&mut buf[*have..])? {
            0 => return Ok(false),
            n => *have += n,
        }
    }
    Ok(true)
}

fn cut(at: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("sealed data stream cut short {at}"),
    )
}

impl Opener {
    pub fn new(keys: Keys) -> Opener {
        Opener {
            keys,
            hdr: [0; HEADER],
            hdr_have: 0,
            body: Vec::new(),
            body_have: 0,
            plain: (0, 0),
            closed: false,
        }
    }

    /// Plaintext into `out` from the frames `src` gives: 0 only after the
    /// close frame; an error for a frame that does not open or a source
    /// that ends without the close.
    pub fn read(&mut self, src: &mut impl Read, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            if self.plain.0 < self.plain.1 {
                let (a, b) = self.plain;
                let n = out.len().min(b - a);
                out[..n].copy_from_slice(&self.body[a..a + n]);
                self.plain.0 += n;
                return Ok(n);
            }
            if self.closed {
                return Ok(0);
            }
            if self.hdr_have < HEADER {
                let started = self.hdr_have > 0;
                if !read_into(src, &mut self.hdr, &mut self.hdr_have)? {
                    return Err(cut(if started {
                        "inside a frame's header"
                    } else {
                        "without its close frame"
                    }));
                }
                let (len, close) = parse_header(self.hdr)?;
                size(&mut self.body, len + TAG);
                self.body_have = 0;
                if !close && len > 0 && out.len() >= len {
                    return self.read_in_place(src, &mut out[..len]);
                }
            }
            if !read_into(src, &mut self.body, &mut self.body_have)? {
                return Err(cut("inside a frame"));
            }
            let h = self.hdr;
            let (len, close) = parse_header(h)?;
            (self.hdr_have, self.body_have) = (0, 0);
            if close || len == 0 {
                timed(Stage::Decrypt, || {
                    open(&mut self.keys, h, &self.body, &mut [])
                })?;
                self.closed = close;
                continue;
            }
            if out.len() >= len {
                timed(Stage::Decrypt, || {
                    open(&mut self.keys, h, &self.body, &mut out[..len])
                })?;
                return Ok(len);
            }
            let (key, nonce) = self.keys.next()?;
            timed(Stage::Decrypt, || {
                key.open_in_place(nonce, Aad::from(h), &mut self.body)
                    .map_err(|_| broken(FAILED))
            })?;
            self.plain = (0, len);
        }
    }

    /// A frame of `out.len()` bytes (its header read) received straight
    /// into `out` and opened there: through `body`, every byte would be
    /// copied once more, and the frame would take twice the cache. Bytes
    /// of it read before an error (a time-out) move to `body`, so that the
    /// next read goes on from there whatever buffer it brings. Plaintext
    /// that did not authenticate is never returned: `out` then holds
    /// nothing the caller may use (the read is an error).
    fn read_in_place(&mut self, src: &mut impl Read, out: &mut [u8]) -> io::Result<usize> {
        let len = out.len();
        let (mut have, mut tag_have) = (0, 0);
        let tag = &mut self.body[len..len + TAG];
        let whole = read_into(src, out, &mut have)
            .and_then(|whole| Ok(whole && read_into(src, tag, &mut tag_have)?));
        match whole {
            Ok(true) => {}
            Ok(false) => return Err(cut("inside a frame")),
            Err(e) => {
                self.body[..have].copy_from_slice(&out[..have]);
                self.body_have = have + tag_have;
                return Err(e);
            }
        }
        let h = self.hdr;
        (self.hdr_have, self.body_have) = (0, 0);
        let (key, nonce) = self.keys.next()?;
        let tag = &self.body[len..len + TAG];
        timed(Stage::Decrypt, || {
            key.open_in_place_separate_tag(nonce, Aad::from(h), tag, out)
                .map_err(|_| broken(FAILED))
        })?;
        Ok(len)
    }

    /// Whether bytes read are held here, not yet returned.
    pub fn pending(&self) -> bool {
        self.plain.0 < self.plain.1 || self.hdr_have > 0
    }
}

/// Which end turns a data stream into sealed frames.
#[derive(Debug, Clone, Copy)]
pub enum Side {
    Client,
    /// `sends`: the server is the source (a pull).
    Server {
        sends: bool,
    },
}

/// The stream in sealed frames from here on: the client once its hello is
/// sent, the server once it has read it. Only a TLS data stream can be
/// sealed (the keys are its session's).
pub fn into_sealed(stream: Box<dyn Stream>, side: Side) -> io::Result<Box<dyn Stream>> {
    let any: Box<dyn Any + Send> = stream;
    let Ok(tls) = any.downcast::<Tls>() else {
        return Err(io::Error::other("sealed frames need a TLS data stream"));
    };
    Ok(Box::new(match side {
        Side::Client => Sealed::client(tls)?,
        Side::Server { sends } => Sealed::server(tls, sends)?,
    }))
}

/// A data stream in sealed frames, over the socket its TLS session ran on.
pub struct Sealed {
    tls: Box<Tls>,
    tx: Keys,
    rx: Opener,
    /// Small writes gathered: header room, then payload.
    gather: Vec<u8>,
    /// A large write's frame (kept at its size: never zeroed again).
    out: Vec<u8>,
    /// Sending broke mid-frame: nothing more can be sent.
    tx_broken: bool,
    /// Receiving: the client still reads TLS up to the server's marker.
    rx_tls: bool,
}

impl Sealed {
    /// The client's side, once its hello is sent in TLS: it sends sealed
    /// frames from now on, and reads TLS up to the server's marker.
    pub fn client(tls: Box<Tls>) -> io::Result<Sealed> {
        Sealed::new(tls, true)
    }

    /// The server's side, once it has read the data stream's hello: if
    /// it `sends` on the stream (a pull), it sends the marker in TLS first;
    /// sealed frames from then on, both ways. On a push nothing is sent:
    /// bytes the client never reads would turn its close into a reset.
    pub fn server(mut tls: Box<Tls>, sends: bool) -> io::Result<Sealed> {
        if tls.plaintext_pending() {
            return Err(broken("TLS data after the hello"));
        }
        if sends {
            tls.write_all(MARKER)?;
            tls.flush()?;
        }
        Sealed::new(tls, false)
    }

    fn new(mut tls: Box<Tls>, rx_tls: bool) -> io::Result<Sealed> {
        let (tx, rx) = secrets(&tls)?;
        if !rx_tls {
            tls.sock().records = false;
        }
        Ok(Sealed {
            tls,
            tx,
            rx: Opener::new(rx),
            gather: Vec::with_capacity(HEADER + GATHER + TAG),
            out: Vec::new(),
            tx_broken: false,
            rx_tls,
        })
    }

    /// Reads TLS up to the marker (the client, once).
    fn leave_tls(&mut self) -> io::Result<()> {
        let mut m = [0u8; MARKER.len()];
        self.tls
            .read_exact(&mut m)
            .map_err(|e| broken(format!("the server did not start sealed frames: {e}")))?;
        if &m != MARKER {
            return Err(broken("the server sent something else than the sealed-frames marker (was the stream refused?)"));
        }
        if self.tls.plaintext_pending() {
            return Err(broken("TLS data after the marker"));
        }
        self.tls.sock().records = false;
        self.rx_tls = false;
        Ok(())
    }

    /// Sends a sealed frame: the gathered one, or `out`. A frame cut
    /// by an error leaves the stream unusable.
    fn send_frame(&mut self, gathered: bool) -> io::Result<()> {
        if self.tx_broken {
            return Err(broken("an earlier send failed"));
        }
        let frame = if gathered { &self.gather } else { &self.out };
        let sent = self.tls.sock().send_all(frame);
        self.tx_broken = sent.is_err();
        sent
    }

    /// Seals and sends what small writes gathered.
    fn send_gathered(&mut self) -> io::Result<()> {
        if self.gather.len() > HEADER {
            timed(Stage::Encrypt, || {
                seal_in_place(&mut self.tx, &mut self.gather)
            })?;
            self.send_frame(true)?;
        }
        self.gather.clear();
        Ok(())
    }

    /// Seals `piece` in place and sends it, header and tag around it.
    fn send_sealed_in_place(&mut self, piece: &mut [u8]) -> io::Result<()> {
        if self.tx_broken {
            return Err(broken("an earlier send failed"));
        }
        let (h, tag) = timed(Stage::Encrypt, || seal_piece(&mut self.tx, piece))?;
        let frame = [
            IoSlice::new(&h),
            IoSlice::new(piece),
            IoSlice::new(tag.as_ref()),
        ];
        let sent = write_all_vectored(self.tls.sock().tcp(), frame);
        self.tx_broken = sent.is_err();
        sent
    }

    /// Seals `plain` into `out` and sends it.
    fn send_sealed(&mut self, plain: &[u8], close: bool) -> io::Result<()> {
        timed(Stage::Encrypt, || {
            seal(&mut self.tx, plain, close, &mut self.out)
        })?;
        self.send_frame(false)
    }
}

/// Writes every byte of `bufs`, in as few calls as the socket takes.
fn write_all_vectored<const N: usize>(
    mut w: impl Write,
    mut bufs: [IoSlice<'_>; N],
) -> io::Result<()> {
    let mut left = &mut bufs[..];
    while !left.is_empty() {
        match w.write_vectored(left) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut left, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Read for Sealed {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.rx_tls {
            self.leave_tls()?;
        }
        self.rx.read(self.tls.sock(), out)
    }
}

impl Write for Sealed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() >= GATHER {
            self.send_gathered()?;
            let n = buf.len().min(MAX_FRAME);
            self.send_sealed(&buf[..n], false)?;
            return Ok(n);
        }
        if self.gather.is_empty() {
            self.gather.resize(HEADER, 0);
        }
        let n = buf.len().min(GATHER - (self.gather.len() - HEADER));
        self.gather.extend_from_slice(&buf[..n]);
        if self.gather.len() - HEADER == GATHER {
            self.send_gathered()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send_gathered()?;
        self.tls.sock().flush()
    }
}

impl Drop for Sealed {
    /// The socket's sending side ends here, so that the TLS session under
    /// it can no longer write a close_notify into the frames.
    fn drop(&mut self) {
        let _ = self.tls.sock().tcp().shutdown(Shutdown::Write);
    }
}

impl Stream for Sealed {
    fn tcp(&self) -> &TcpStream {
        self.tls.tcp()
    }

    fn close_write(&mut self) -> io::Result<()> {
        self.send_gathered()?;
        self.send_sealed(&[], true)?;
        self.tcp().shutdown(Shutdown::Write)
    }

    fn is_tls(&self) -> bool {
        true
    }

    fn write_all_scratch(&mut self, buf: &mut [u8]) -> io::Result<()> {
        if buf.len() < GATHER {
            return self.write_all(buf);
        }
        self.send_gathered()?;
        for piece in buf.chunks_mut(MAX_FRAME) {
            self.send_sealed_in_place(piece)?;
        }
        Ok(())
    }

    fn pending(&mut self) -> bool {
        self.rx.pending()
            || self.tls.sock().buffered()
            || (self.rx_tls && self.tls.plaintext_pending())
    }

    fn peer_fingerprint(&self) -> Option<String> {
        self.tls.peer_fingerprint()
    }

    fn encryption(&self) -> String {
        format!("{}, sealed frames", self.tls.encryption())
    }

    fn into_plain(self: Box<Self>) -> Result<TcpStream, Box<dyn Stream>> {
        Err(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Keys, Keys) {
        let secret = [7u8; 32];
        (
            Keys::new(&aead::AES_128_GCM, secret),
            Keys::new(&aead::AES_128_GCM, secret),
        )
    }

    fn frame(keys: &mut Keys, plain: &[u8], close: bool) -> Vec<u8> {
        let mut out = Vec::new();
        seal(keys, plain, close, &mut out).unwrap();
        out
    }

    fn open_frame(keys: &mut Keys, f: &[u8]) -> io::Result<Vec<u8>> {
        let h: [u8; HEADER] = f[..HEADER].try_into().unwrap();
        let (len, _) = parse_header(h)?;
        let mut out = vec![0u8; len];
        open(keys, h, &f[HEADER..], &mut out)?;
        Ok(out)
    }

    #[test]
    fn frames_open_in_order_and_nothing_else_opens() {
        let (mut tx, mut rx) = pair();
        let a = frame(&mut tx, b"first", false);
        let b = frame(&mut tx, b"second", false);
        assert_eq!(open_frame(&mut rx, &a).unwrap(), b"first");
        // Replayed: the counter moved on.
        assert!(open_frame(&mut rx, &a).is_err());

        let (mut tx, mut rx) = pair();
        let a = frame(&mut tx, b"first", false);
        let b2 = frame(&mut tx, b"second", false);
        // Reordered, or one dropped.
        assert!(open_frame(&mut rx, &b2).is_err());
        let _ = (a, b);

        let (mut tx, mut rx) = pair();
        let mut a = frame(&mut tx, b"first", false);
        a[HEADER + 1] ^= 1;
        assert!(open_frame(&mut rx, &a).is_err(), "a flipped bit opened");

        // The header is authenticated: a payload cut shorter fails.
        let (mut tx, mut rx) = pair();
        let a = frame(&mut tx, b"first frame", false);
        let mut cut = a.clone();
        cut[..HEADER].copy_from_slice(&header(5, false));
        cut.drain(HEADER + 5..a.len() - TAG);
        assert!(open_frame(&mut rx, &cut).is_err());

        // A data frame turned into a close is refused or fails.
        let (mut tx, mut rx) = pair();
        let mut empty = frame(&mut tx, b"", false);
        empty[0] |= 0x80;
        assert!(open_frame(&mut rx, &empty).is_err());
    }

    #[test]
    fn directions_and_sessions_do_not_share_keys() {
        let (mut tx, _) = pair();
        let f = frame(&mut tx, b"data", false);
        let mut other = Keys::new(&aead::AES_128_GCM, [8u8; 32]);
        assert!(open_frame(&mut other, &f).is_err());
    }

    #[test]
    fn the_key_changes_each_epoch_and_both_ends_follow() {
        let (tx, rx) = pair();
        let (mut tx, mut rx) = (tx.at(FRAMES_PER_KEY - 1), rx.at(FRAMES_PER_KEY - 1));
        let a = frame(&mut tx, b"last of epoch 0", false);
        let b = frame(&mut tx, b"first of epoch 1", false);
        assert_eq!(open_frame(&mut rx, &a).unwrap(), b"last of epoch 0");
        assert_eq!(open_frame(&mut rx, &b).unwrap(), b"first of epoch 1");
        // The same counter under epoch 0's key would not open epoch 1's frame.
        let k0 = epoch_key(&aead::AES_128_GCM, &[7u8; 32], 0).unwrap();
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&FRAMES_PER_KEY.to_be_bytes());
        let mut body = b[HEADER..].to_vec();
        let h: [u8; HEADER] = b[..HEADER].try_into().unwrap();
        assert!(k0
            .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(h), &mut body)
            .is_err());
    }

    /// Reads everything `opener` gives from `bytes`, in reads of `step`.
    fn read_all(bytes: &[u8], step: usize) -> io::Result<Vec<u8>> {
        let (_, rx) = pair();
        let mut opener = Opener::new(rx);
        let mut src = bytes;
        let mut got = Vec::new();
        let mut buf = vec![0u8; step];
        loop {
            match opener.read(&mut src, &mut buf)? {
                0 => return Ok(got),
                n => got.extend_from_slice(&buf[..n]),
            }
        }
    }

    #[test]
    fn a_stream_reads_back_whatever_the_read_sizes_and_a_cut_is_an_error() {
        let (mut tx, _) = pair();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        let mut wire = Vec::new();
        for piece in [&data[..10], &data[10..200_000], &data[200_000..]] {
            wire.extend(frame(&mut tx, piece, false));
        }
        wire.extend(frame(&mut tx, b"", false));
        let closed_at = wire.len();
        wire.extend(frame(&mut tx, b"", true));
        for step in [1, 7, 4096, 190_000, 1 << 20] {
            assert_eq!(read_all(&wire, step).unwrap(), data, "reads of {step}");
        }
        // Cut anywhere before the close frame is complete: an error, never
        // a short success.
        for at in [
            0,
            3,
            4,
            100,
            wire.len() - TAG - 1,
            closed_at,
            wire.len() - 1,
        ] {
            let e = read_all(&wire[..at], 4096).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "cut at {at}: {e}");
        }
        // A frame dropped from the middle, or two swapped.
        let (mut tx, _) = pair();
        let (a, b, c) = (
            frame(&mut tx, b"one", false),
            frame(&mut tx, b"two", false),
            frame(&mut tx, b"", true),
        );
        assert_eq!(
            read_all(&[a.clone(), b.clone(), c.clone()].concat(), 64).unwrap(),
            b"onetwo"
        );
        assert!(read_all(&[a.clone(), c.clone()].concat(), 64).is_err());
        assert!(read_all(&[b.clone(), a.clone(), c.clone()].concat(), 64).is_err());
        assert!(
            read_all(&[a.clone(), a, b, c].concat(), 64).is_err(),
            "a replay opened"
        );
    }

    /// Gives `bytes` in reads of at most `step`, failing with a time-out
    /// before every `every`-th read.
    struct Stalling<'a> {
        bytes: &'a [u8],
        step: usize,
        every: usize,
        reads: usize,
    }

    impl Read for Stalling<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            self.reads += 1;
            if self.reads % self.every == 0 {
                return Err(io::ErrorKind::TimedOut.into());
            }
            let n = out.len().min(self.step).min(self.bytes.len());
            out[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    #[test]
    fn frames_opened_in_the_callers_buffer_survive_time_outs_and_changing_buffers() {
        let (mut tx, _) = pair();
        let data: Vec<u8> = (0..700_000u32).map(|i| (i * 13 + i / 251) as u8).collect();
        let mut wire = Vec::new();
        for piece in data.chunks(300_000) {
            let mut piece = piece.to_vec();
            let (h, tag) = seal_piece(&mut tx, &mut piece).unwrap();
            wire.extend([&h[..], &piece, tag.as_ref()].concat());
        }
        wire.extend(frame(&mut tx, b"", true));
        for (step, every) in [(1 << 20, 2), (65_536, 3), (7_000, 5), (300_016, 2)] {
            let (_, rx) = pair();
            let mut opener = Opener::new(rx);
            let mut src = Stalling {
                bytes: &wire,
                step,
                every,
                reads: 0,
            };
            let mut got = Vec::new();
            let mut calls = 0usize;
            loop {
                calls += 1;
                // Big enough to open a frame in place, or not, by turns.
                let mut buf = vec![0u8; if calls % 3 == 0 { 1000 } else { 400_000 }];
                match opener.read(&mut src, &mut buf) {
                    Ok(0) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                    Err(e) => panic!("reads of {step}: {e}"),
                }
            }
            assert!(got == data, "reads of {step}, a time-out every {every}");
        }
        // A flipped bit in a frame opened in place is an error.
        let mut bad = wire.clone();
        bad[HEADER + 1000] ^= 1;
        let (_, rx) = pair();
        let mut opener = Opener::new(rx);
        let mut buf = vec![0u8; 400_000];
        assert!(opener.read(&mut &bad[..], &mut buf).is_err());
    }

    #[test]
    fn bad_headers_are_refused() {
        assert!(parse_header(((MAX_FRAME + 1) as u32).to_be_bytes()).is_err());
        assert!(parse_header((CLOSE | 3).to_be_bytes()).is_err());
        assert_eq!(parse_header(CLOSE.to_be_bytes()).unwrap(), (0, true));
        assert_eq!(parse_header(16u32.to_be_bytes()).unwrap(), (16, false));
    }
}
