//! Which shard of an index holds a document: the engine's own routing, computed here so that
//! a read can be vouched for against the checkpoints of the shard it came from
//! (the service's `src/store/elasticsearch/vouch.rs`, and the emulator's shards; `docs/design.md`
//! §2, "Shards").
//!
//! Documents are routed by their id (no custom routing): Elasticsearch and OpenSearch hash
//! the id's UTF-16 code units, low byte first, with Murmur3 (x86, 32 bits, seed 0), and take
//! `floor_mod(hash, routing_shards) / (routing_shards / shards)`. `routing_shards` is the
//! index's `number_of_routing_shards`: set at creation when asked for, else
//! `shards × 2^k` for the largest `k` that keeps it at or below 1,024 (so that the index can
//! later be split by powers of two). A split keeps the source's routing shards, which is that
//! same default for every split the engines allow from a default index (from one shard to
//! any count, or by a power of two), so the rule needs only the shard count and, when
//! present, the setting. The differential test checks it against the engine's own answer
//! (`_search` with `explain`, which names each hit's shard) on both engines.

use std::io::Cursor;

/// What the routing of one index depends on, read from its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Routing {
    /// `index.number_of_shards`.
    pub shards: u32,
    /// `index.number_of_routing_shards` (its default when the index does not set it).
    pub routing_shards: u32,
}

impl Routing {
    /// An index of one shard: every document is on shard 0.
    pub const SINGLE: Routing = Routing {
        shards: 1,
        routing_shards: 1024,
    };

    /// The routing of an index of `shards` shards, with `number_of_routing_shards` when the
    /// index's settings name it; `None` for counts the engines cannot hold.
    pub fn of(shards: u32, routing_shards: Option<u32>) -> Option<Routing> {
        let routing_shards = routing_shards.unwrap_or_else(|| default_routing_shards(shards));
        let valid =
            shards >= 1 && routing_shards >= shards && routing_shards.is_multiple_of(shards);
        valid.then_some(Routing {
            shards,
            routing_shards,
        })
    }

    /// The number (from 0) of the shard that holds the document `id`.
    pub fn shard_of(&self, id: &str) -> u32 {
        if self.shards == 1 {
            return 0;
        }
        let hash = id_hash(id) as i64;
        let routing_shards = i64::from(self.routing_shards);
        let factor = routing_shards / i64::from(self.shards);
        (hash.rem_euclid(routing_shards) / factor) as u32
    }
}

/// The engines' default `number_of_routing_shards` for an index created with `shards`
/// shards (`MetadataCreateIndexService.calculateNumRoutingShards`, indices created by 7.0
/// and later, and every OpenSearch): the shard count doubled while it stays within 1,024.
pub fn default_routing_shards(shards: u32) -> u32 {
    let log2_shards = u32::BITS - shards.saturating_sub(1).leading_zeros();
    // At least one split, so that every index can be split once ("Ensure the index can be
    // split at least once", in the engines' own words): 1,024 shards route over 2,048.
    let splits = 10u32.saturating_sub(log2_shards).max(1);
    shards << splits
}

/// `Murmur3HashFunction.hash(String)`: Murmur3 x86 32-bit, seed 0, over the id's UTF-16
/// code units, each low byte first; as the signed `int` Java works with.
fn id_hash(id: &str) -> i32 {
    let bytes: Vec<u8> = id.encode_utf16().flat_map(u16::to_le_bytes).collect();
    let hash = murmur3::murmur3_32(&mut Cursor::new(bytes), 0).expect("reading from memory");
    hash as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_routing_shards_double_the_count_up_to_1024() {
        assert_eq!(default_routing_shards(1), 1024);
        assert_eq!(default_routing_shards(2), 1024);
        assert_eq!(default_routing_shards(3), 768);
        assert_eq!(default_routing_shards(5), 640);
        assert_eq!(default_routing_shards(8), 1024);
        assert_eq!(default_routing_shards(512), 1024);
        assert_eq!(default_routing_shards(513), 1026, "split at least once");
        assert_eq!(default_routing_shards(1024), 2048);
    }

    #[test]
    fn an_index_of_one_shard_holds_every_document_on_shard_0() {
        for id in ["a", "t-1", "0b8f3c1e-9a52-4d8e-b7a1-2f4c6d8e0a13"] {
            assert_eq!(Routing::SINGLE.shard_of(id), 0);
        }
    }

    #[test]
    fn the_hash_is_murmur3_over_utf16_code_units() {
        // Murmur3 x86_32 of no bytes, seed 0, is 0; Java's `hash("")` agrees.
        assert_eq!(id_hash(""), 0);
        // The same id hashes the same way every time and spreads over the shards.
        let routing = Routing::of(3, None).unwrap();
        let mut counts = [0u32; 3];
        for n in 0..3000 {
            counts[routing.shard_of(&format!("t-{n}")) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
    }

    /// Read off Elasticsearch 8.19.21: documents indexed under these ids into indices of 3
    /// and 5 shards, then found by `_search?explain=true`, which names each hit's shard.
    #[test]
    fn ids_land_on_the_shards_elasticsearch_put_them_on() {
        let three = Routing::of(3, None).unwrap();
        let five = Routing::of(5, None).unwrap();
        let seen = [
            ("0b8f3c1e-9a52-4d8e-b7a1-2f4c6d8e0a13", 2, 2),
            ("a", 0, 1),
            ("acct-42", 0, 4),
            ("b", 2, 0),
            ("t-1", 1, 1),
            ("t-2", 0, 2),
            ("x.y:z_1", 1, 1),
            ("\u{fc}\u{20ac}", 0, 4),
        ];
        for (id, on_three, on_five) in seen {
            assert_eq!(three.shard_of(id), on_three, "{id} of 3 shards");
            assert_eq!(five.shard_of(id), on_five, "{id} of 5 shards");
        }
    }

    #[test]
    fn shard_counts_the_engines_refuse_have_no_routing() {
        assert_eq!(Routing::of(0, None), None);
        assert_eq!(
            Routing::of(3, Some(1024)),
            None,
            "1024 is not a multiple of 3"
        );
        assert_eq!(
            Routing::of(3, Some(6)),
            Some(Routing {
                shards: 3,
                routing_shards: 6
            })
        );
    }
}
