//! A document's value at rest: its `seq_no` (8 bytes, little-endian), then its body, which is
//! either the source as the caller sent it (JSON, so its first byte is `{`) or, for a
//! transfer written in a terminal state, the source compressed: a marker byte naming a
//! dictionary and a zstd frame made with it. This version writes [`ZSTD_DICTIONARY_2`]
//! ([`DICTIONARY_2`]) and reads that and [`ZSTD_DICTIONARY_1`] ([`DICTIONARY_1`]).
//!
//! **Why terminal transfers.** They are what a store holds nearly all of (every transfer ends
//! terminal and stays), and they are written once more at most; the documents rewritten at
//! every step (in-flight transfers, accounts, webhook cursors) stay plain, so no step pays
//! for compressing a document that the next step replaces. A transfer's JSON repeats its
//! field names and the shape of its times and ids; zstd with a dictionary of those takes
//! a finished transfer from about 330 bytes to about 110.
//!
//! **The dictionaries.** [`DICTIONARY_1`] (stores of late November 2026) is raw content: the
//! field names and shapes, written by hand. zstd then had to describe the entropy tables of
//! every document in the document itself, and build them each time: 3.8–4.2 µs and 133
//! bytes a finished transfer. [`DICTIONARY_2`] is trained (`examples/train_dictionary.rs`) on
//! the terminal documents of the engine's own transfers of every kind, by either protocol;
//! it holds the shared strings and entropy tables over every byte, which a small document
//! reuses instead of making its own: 1.3–1.4 µs and 105 bytes for the same documents, and
//! reading one back 0.7 µs instead of 1.6–1.9 (measured in-process, twice, on 20,000
//! finished transfers of the benchmark's preload, which the training never saw).
//!
//! **Compatibility.** A store written before compression holds plain bodies only, which read
//! as before; this version reads both. A version before it cannot read a compressed body
//! (it reports the document as not decoding): going back needs a store written by it; a
//! version that reads only [`DICTIONARY_1`] cannot read a body made with [`DICTIONARY_2`].
//! A dictionary can never change once bodies name it by its marker (the tests hold a frame
//! of each): a better one comes with a new marker, the old ones kept for reading.

use std::borrow::Cow;
use std::sync::{LazyLock, Mutex};

use zstd::bulk::{Compressor, Decompressor};
use zstd::dict::{DecoderDictionary, EncoderDictionary};

use super::StoreError;
use crate::store::StoreResult;

/// The marker of a body compressed with [`DICTIONARY_1`]. (A plain body starts with `{`.)
const ZSTD_DICTIONARY_1: u8 = 0x01;

/// The marker of a body compressed with [`DICTIONARY_2`], the one this version writes.
const ZSTD_DICTIONARY_2: u8 = 0x02;

/// The largest source a compressed body may claim to hold: a transfer's source is bounded by
/// the request body limit, far below this; a claim above it is damage.
const MAX_SOURCE: u64 = 64 << 20;

/// zstd's fastest level: on documents of a few hundred bytes it compresses within a few
/// bytes of the default level (105.1 and 105.5 bytes with [`DICTIONARY_2`]; level 3 takes
/// half as long again).
const LEVEL: i32 = 1;

/// Content zstd may refer back to as if it preceded every document (a "raw content"
/// dictionary): a transfer's field names in the order they are written, its states, reasons
/// and the shape of its times. Never change it (see the module's notes).
const DICTIONARY_1: &[u8] = br#"{"legs":[{"from":"","to":"","amount":}],"accounts":["",""],"reason":"insufficient_funds","reason":"account_not_found","reason":"timed_out","reason":"cancelled","reason":"currency_mismatch","reason":"account_busy","reason":"balance_overflow","lease_owner":"","lease_expires_at":"","attention":"","failed_account":"","hold_expires_at":"","captured_amount":,"currency":"","metadata":{"":""},"transaction_state":"rolled-back","transaction_state":"voided","transaction_state":"expired","history":"p1764000000000 c1764000000000 m1764000000000 r1764000000000 f1764000000000","transaction_id":"019ac000-0000-7000-8000-000000000000","src_acct":"","dest_acct":"","amount":1,"transaction_state":"finished","creation_time":"2026-01-01T00:00:00.000Z","modification_time":"2026-01-01T00:00:00.000Z","history":"p1764000000000 m1764000000000 f1764000000000","created_by":"00000000000000000000000000000000","settled_by":"000000000000/1"}"#;

/// A zstd dictionary (1 KiB) trained by `examples/train_dictionary.rs`. Never change it (see
/// the module's notes).
const DICTIONARY_2: &[u8] = include_bytes!("dictionary_2.zdict");

static ENCODER_DICTIONARY_2: LazyLock<EncoderDictionary<'static>> =
    LazyLock::new(|| EncoderDictionary::copy(DICTIONARY_2, LEVEL));

/// A dictionary that stored bodies name by their marker, with the contexts that read them.
struct Readable {
    marker: u8,
    dictionary: LazyLock<DecoderDictionary<'static>>,
    decompressors: Contexts<Decompressor<'static>>,
}

/// Every dictionary a stored body may name.
static READABLE: [Readable; 2] = [
    Readable {
        marker: ZSTD_DICTIONARY_1,
        dictionary: LazyLock::new(|| DecoderDictionary::copy(DICTIONARY_1)),
        decompressors: Contexts::new(),
    },
    Readable {
        marker: ZSTD_DICTIONARY_2,
        dictionary: LazyLock::new(|| DecoderDictionary::copy(DICTIONARY_2)),
        decompressors: Contexts::new(),
    },
];

/// zstd contexts kept for reuse: making one costs more than compressing a document. A few
/// are kept, not one per thread: reads run on tokio's blocking pool, which may start hundreds
/// of threads, and a decompression context holds 96 KB (a compression context 31 KB).
struct Contexts<T> {
    idle: Mutex<Vec<T>>,
}

/// How many idle contexts of each kind are kept (as many as threads use one at once, on a
/// machine of a few cores).
const IDLE_CONTEXTS: usize = 4;

impl<T> Contexts<T> {
    const fn new() -> Self {
        Contexts {
            idle: Mutex::new(Vec::new()),
        }
    }

    /// `f` on an idle context, or on a new one made by `make`; kept afterwards if there is
    /// room.
    fn with<R>(
        &self,
        make: impl FnOnce() -> std::io::Result<T>,
        f: impl FnOnce(&mut T) -> R,
    ) -> std::io::Result<R> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut context = match idle {
            Some(context) => context,
            None => make()?,
        };
        let result = f(&mut context);
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < IDLE_CONTEXTS {
            idle.push(context);
        }
        Ok(result)
    }
}

static COMPRESSORS: Contexts<Compressor<'static>> = Contexts::new();

/// The value at rest of a document written with `seq_no`: `source` compressed when
/// `compress` (a terminal transfer) and the compressed body is the smaller, else as it is.
pub(super) fn value_of(seq_no: u64, source: &[u8], compress: bool) -> Vec<u8> {
    let compressed = compress.then(|| compress_body(source)).flatten();
    let body = compressed.as_deref().unwrap_or(source);
    let mut value = Vec::with_capacity(8 + body.len());
    value.extend_from_slice(&seq_no.to_le_bytes());
    value.extend_from_slice(body);
    value
}

/// The `seq_no` of a stored value, without its source.
pub(super) fn seq_no_of(id: &str, value: &[u8]) -> StoreResult<u64> {
    match value.split_first_chunk::<8>() {
        Some((seq, _)) => Ok(u64::from_le_bytes(*seq)),
        None => Err(truncated(id)),
    }
}

/// The `seq_no` and source (JSON) of a stored value: borrowed when stored plain, else
/// decompressed.
pub(super) fn split_stored<'a>(id: &str, value: &'a [u8]) -> StoreResult<(u64, Cow<'a, [u8]>)> {
    let Some((seq, body)) = value.split_first_chunk::<8>() else {
        return Err(truncated(id));
    };
    let readable = body
        .split_first()
        .and_then(|(&marker, frame)| Some((READABLE.iter().find(|r| r.marker == marker)?, frame)));
    let source = match readable {
        Some((dictionary, frame)) => Cow::Owned(decompress_body(id, dictionary, frame)?),
        None => Cow::Borrowed(body),
    };
    Ok((u64::from_le_bytes(*seq), source))
}

/// The marker and frame of `source` compressed, if that is smaller than `source`. `None`
/// also when zstd fails (it has no reason to; the source is then stored plain).
fn compress_body(source: &[u8]) -> Option<Vec<u8>> {
    let make = || Compressor::with_prepared_dictionary(&ENCODER_DICTIONARY_2);
    COMPRESSORS
        .with(make, |compressor| {
            compressed_by(compressor, ZSTD_DICTIONARY_2, source)
        })
        .ok()
        .flatten()
}

/// `marker` and `source` compressed by `compressor` (which holds the dictionary `marker`
/// names), if that is smaller than `source`.
fn compressed_by(compressor: &mut Compressor<'_>, marker: u8, source: &[u8]) -> Option<Vec<u8>> {
    let mut body = vec![0; 1 + zstd::zstd_safe::compress_bound(source.len())];
    body[0] = marker;
    let written = compressor.compress_to_buffer(source, &mut body[1..]).ok()?;
    body.truncate(1 + written);
    (body.len() < source.len()).then_some(body)
}

fn decompress_body(id: &str, dictionary: &'static Readable, frame: &[u8]) -> StoreResult<Vec<u8>> {
    let damaged = |why: String| {
        StoreError::Permanent(format!(
            "embedded store: document {id} does not decompress: {why}"
        ))
    };
    let size = match zstd::zstd_safe::get_frame_content_size(frame) {
        Ok(Some(size)) if size <= MAX_SOURCE => size as usize,
        Ok(size) => return Err(damaged(format!("its frame claims {size:?} bytes"))),
        Err(e) => return Err(damaged(format!("{e:?}"))),
    };
    let make = || Decompressor::with_prepared_dictionary(&dictionary.dictionary);
    let decompressed = dictionary.decompressors.with(make, |decompressor| {
        let mut source = Vec::with_capacity(size);
        decompressor
            .decompress_to_buffer(frame, &mut source)
            .map(|written| (written, source))
    });
    match decompressed {
        Ok(Ok((written, source))) if written == size => Ok(source),
        Ok(Ok((written, _))) => Err(damaged(format!("{written} bytes, its frame claims {size}"))),
        Ok(Err(e)) | Err(e) => Err(damaged(e.to_string())),
    }
}

fn truncated(id: &str) -> StoreError {
    StoreError::Permanent(format!("embedded store: document {id} is truncated"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FINISHED: &str = r#"{"transaction_id":"019ac4f0-1b2c-7d3e-8f40-5a6b7c8d9e0f","src_acct":"acct-17","dest_acct":"acct-842","amount":250,"transaction_state":"finished","creation_time":"2026-11-27T05:20:00.123Z","modification_time":"2026-11-27T05:20:00.125Z","history":"p1764220800124 c1764220800124 m1764220800124 f1764220800125","created_by":"d7ae77b61df64efa83dc5a89758fe561","settled_by":"7744929b3213/178830"}"#;

    #[test]
    fn a_terminal_transfer_is_stored_compressed_and_reads_back_as_sent() {
        let value = value_of(42, FINISHED.as_bytes(), true);
        assert_eq!(value[8], ZSTD_DICTIONARY_2);
        assert!(
            value.len() < 8 + FINISHED.len() / 2,
            "{} bytes at rest for {} of JSON",
            value.len(),
            FINISHED.len()
        );
        let (seq_no, source) = split_stored("t", &value).unwrap();
        assert_eq!((seq_no, &*source), (42, FINISHED.as_bytes()));
        assert!(matches!(source, Cow::Owned(_)));
        assert_eq!(seq_no_of("t", &value).unwrap(), 42);
    }

    #[test]
    fn other_documents_are_stored_as_sent_and_read_back_borrowed() {
        let value = value_of(7, FINISHED.as_bytes(), false);
        assert_eq!(&value[8..], FINISHED.as_bytes());
        let (seq_no, source) = split_stored("t", &value).unwrap();
        assert_eq!((seq_no, &*source), (7, FINISHED.as_bytes()));
        assert!(matches!(source, Cow::Borrowed(_)));
    }

    #[test]
    fn a_source_that_would_not_shrink_is_stored_as_sent() {
        let tiny = br#"{}"#;
        assert_eq!(&value_of(1, tiny, true)[8..], tiny);
    }

    #[test]
    fn contexts_serve_many_threads_at_once_and_only_a_few_are_kept() {
        let value = value_of(5, FINISHED.as_bytes(), true);
        std::thread::scope(|scope| {
            for _ in 0..16 {
                scope.spawn(|| {
                    for _ in 0..50 {
                        assert_eq!(&*split_stored("t", &value).unwrap().1, FINISHED.as_bytes());
                        assert_eq!(value_of(5, FINISHED.as_bytes(), true), value);
                    }
                });
            }
        });
        for readable in &READABLE {
            assert!(readable.decompressors.idle.lock().unwrap().len() <= IDLE_CONTEXTS);
        }
        assert!(COMPRESSORS.idle.lock().unwrap().len() <= IDLE_CONTEXTS);
    }

    #[test]
    fn a_damaged_or_truncated_value_is_a_permanent_error_naming_the_document() {
        let mut value = value_of(3, FINISHED.as_bytes(), true);
        let last = value.len() - 1;
        value.truncate(last);
        let Err(StoreError::Permanent(why)) = split_stored("t-9", &value) else {
            panic!("a cut frame decoded");
        };
        assert!(why.contains("t-9") && why.contains("decompress"), "{why}");
        assert!(matches!(
            split_stored("t-9", &[1, 2]),
            Err(StoreError::Permanent(_))
        ));
        assert!(matches!(
            seq_no_of("t-9", &[1, 2]),
            Err(StoreError::Permanent(_))
        ));
    }

    /// [`FINISHED`]'s body as a store holds it, made with each dictionary by the version that
    /// introduced it: a dictionary changed under stored bodies would no longer read them.
    const FROZEN_BODIES: [&[&str]; 2] = [
        &[
            "0128b52ffd6086005d0400b2471615a0a56d03e1b7d40466d5c3b7cd16d929fda6ff9b1585c184ea0f20cec2",
            "1013c4ff46a6d53cd19207092d9b702cba61fe548e72d167a666a7f0399026b8ebced246fdd5e09cb29608d2",
            "73334a96e16a25815ec7e6ca160901130000e4091772803358032d6442504a60071a807552cd01dc01025add",
            "9e31b7e2e408608d7666904eb660c070882b",
        ],
        &[
            "0228b52ffd63027f51788600b5030083871195e5a47bdf0af230d3e3ab76f3b2e6dbef68d54a478d29b7759c",
            "ba19eab58d0e0502c53bc70fa2f2e249ce991c9cec22aaf7b5c37eb9eac468cdd1e686e56aa3309d394d15fa",
            "13fcc662001c45edf6985f5e16977a584024859846d2443983a58b7bc8f16331497920a40ff74eb5392978e8",
            "42",
        ],
    ];

    fn bytes_of(hex: &[&str]) -> Vec<u8> {
        let hex = hex.concat();
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect()
    }

    #[test]
    fn bodies_made_with_either_dictionary_still_read_as_sent() {
        for (frozen, marker) in FROZEN_BODIES
            .into_iter()
            .zip([ZSTD_DICTIONARY_1, ZSTD_DICTIONARY_2])
        {
            let body = bytes_of(frozen);
            assert_eq!(body[0], marker);
            let mut value = 9u64.to_le_bytes().to_vec();
            value.extend_from_slice(&body);
            let (seq_no, source) = split_stored("t", &value).unwrap();
            assert_eq!(
                (seq_no, &*source),
                (9, FINISHED.as_bytes()),
                "marker {marker}"
            );
        }
    }

    #[test]
    fn the_trained_dictionary_stores_a_finished_transfer_in_fewer_bytes_than_the_first() {
        let mut first = Compressor::with_dictionary(LEVEL, DICTIONARY_1).unwrap();
        let by_first = compressed_by(&mut first, ZSTD_DICTIONARY_1, FINISHED.as_bytes()).unwrap();
        let by_trained = compress_body(FINISHED.as_bytes()).unwrap();
        assert!(
            by_trained.len() < by_first.len(),
            "{} bytes with the trained dictionary, {} with the first",
            by_trained.len(),
            by_first.len()
        );
    }
}
