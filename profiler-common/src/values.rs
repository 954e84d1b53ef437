//! `stat --by FIELD`: each tracing event's hits by the targets counted per value of one of its
//! numbers (a tracepoint's field, a probe's argument or return value), or per power-of-two range
//! of it (`FIELD:log2`), in a per-CPU hash the program adds to at each hit.
use core::mem::size_of;

/// Distinct (event, value) pairs kept; hits of further values are counted apart, per event.
pub const VALUE_COUNT_ENTRIES: u32 = 16 * 1024;

/// Where an event's counted number is in its program's context, and how it is read
/// (`BY_FIELDS`, by the event's place in the run).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByField {
    /// Its byte offset in the context (a tracepoint's record, a probe's registers).
    pub offset: u16,
    /// 1, 2, 4 or 8 bytes.
    pub size: u8,
    /// Sign-extended from `size`.
    pub signed: u8,
    /// Counted per power-of-two range (`log2_bucket`), not per value.
    pub log2: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(size_of::<ByField>() == 8);

impl ByField {
    /// The key's value of `raw` (the context's 8 bytes at `offset`): the number as its size and
    /// sign read it, or its range.
    pub fn value(&self, raw: u64) -> u64 {
        let (unsigned, signed) = crate::sized(raw, self.size);
        let number = match self.signed {
            0 => unsigned,
            _ => signed as u64,
        };
        match (self.log2, self.signed) {
            (0, _) => number,
            (_, 0) => log2_bucket(number),
            _ => signed_log2_bucket(number as i64) as u64,
        }
    }
}

/// The power-of-two range of `n`: 0 for 0, else `b` for `2^(b-1) <= n < 2^b`.
pub fn log2_bucket(n: u64) -> u64 {
    u64::from(64 - n.leading_zeros())
}

/// The same for a signed number, a negative one in the negated range of its magnitude.
pub fn signed_log2_bucket(n: i64) -> i64 {
    match n < 0 {
        true => -(log2_bucket(n.unsigned_abs()) as i64),
        false => log2_bucket(n as u64) as i64,
    }
}

/// One count's key: the event's place in the run and the value (or range).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ValueKey {
    pub event: u32,
    pub _pad: u32,
    pub value: u64,
}
const _: () = assert!(size_of::<ValueKey>() == 16);

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes and signs as a field's, and the ranges: 0, 1, 2..3, 4..7, ...; a negative number in
    /// its magnitude's range, negated.
    #[test]
    fn a_hits_number_is_read_as_its_field_and_put_in_its_range() {
        let field = |size, signed, log2| ByField {
            offset: 0,
            size,
            signed,
            log2,
            _pad: [0; 3],
        };
        assert_eq!(field(4, 0, 0).value(0xdead_beef_0000_0007), 7);
        assert_eq!(field(4, 1, 0).value(0x0000_0001_ffff_fff7) as i64, -9);
        assert_eq!(field(8, 0, 0).value(u64::MAX), u64::MAX);
        let buckets: [u64; 6] = [0, 1, 2, 3, 4, 4096].map(|n| field(8, 0, 1).value(n));
        assert_eq!(buckets, [0, 1, 2, 2, 3, 13]);
        assert_eq!(field(4, 1, 1).value(0xffff_fff7) as i64, -4);
        assert_eq!(field(8, 0, 1).value(u64::MAX), 64);
    }
}
