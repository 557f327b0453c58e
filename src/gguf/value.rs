//! GGUF metadata values: a borrowed view into the file ([`Value`]) and an owned form for writing ([`OwnedValue`]).

use super::GgufError;

/// A metadata value type id (`gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// Encoded size of a scalar of this type (strings and arrays are variable).
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The name gguf-dump prints.
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "UINT8",
            I8 => "INT8",
            U16 => "UINT16",
            I16 => "INT16",
            U32 => "UINT32",
            I32 => "INT32",
            F32 => "FLOAT32",
            Bool => "BOOL",
            String => "STRING",
            Array => "ARRAY",
            U64 => "UINT64",
            I64 => "INT64",
            F64 => "FLOAT64",
        }
    }
}

/// A metadata value borrowed from the file. Arrays are not decoded until iterated.
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    /// Raw bytes: GGUF strings are meant to be UTF-8 but files in the wild are not always.
    String(&'a [u8]),
    Array(ArrayView<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl<'a> Value<'a> {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer type (and bool) as i128, so callers can range-check without caring how a writer typed it.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v as i128,
            Value::I8(v) => v as i128,
            Value::U16(v) => v as i128,
            Value::I16(v) => v as i128,
            Value::U32(v) => v as i128,
            Value::I32(v) => v as i128,
            Value::U64(v) => v as i128,
            Value::I64(v) => v as i128,
            Value::Bool(v) => v as i128,
            _ => return None,
        })
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => self.as_int().map(|v| v != 0),
        }
    }

    /// The string, if this is a string holding valid UTF-8.
    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            Value::String(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<ArrayView<'a>> {
        match *self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Copies the value out of the file (arrays included) for writing elsewhere.
    pub fn to_owned_value(&self) -> OwnedValue {
        match *self {
            Value::U8(v) => OwnedValue::U8(v),
            Value::I8(v) => OwnedValue::I8(v),
            Value::U16(v) => OwnedValue::U16(v),
            Value::I16(v) => OwnedValue::I16(v),
            Value::U32(v) => OwnedValue::U32(v),
            Value::I32(v) => OwnedValue::I32(v),
            Value::F32(v) => OwnedValue::F32(v),
            Value::Bool(v) => OwnedValue::Bool(v),
            Value::String(b) => OwnedValue::String(b.to_vec()),
            Value::Array(a) => {
                OwnedValue::Array(a.elem_type, a.iter().map(|v| v.to_owned_value()).collect())
            }
            Value::U64(v) => OwnedValue::U64(v),
            Value::I64(v) => OwnedValue::I64(v),
            Value::F64(v) => OwnedValue::F64(v),
        }
    }
}

/// A metadata array still in the file: element type, count and its encoded bytes (validated at open).
#[derive(Clone, Copy, Debug)]
pub struct ArrayView<'a> {
    pub elem_type: ValueType,
    pub len: usize,
    pub(crate) bytes: &'a [u8],
    /// GGUF v1 encodes string and array lengths as u32.
    pub(crate) v1: bool,
}

impl<'a> ArrayView<'a> {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Decodes the elements one by one, without allocating.
    pub fn iter(&self) -> ArrayIter<'a> {
        ArrayIter {
            cur: Cursor::new(self.bytes, self.v1),
            elem_type: self.elem_type,
            left: self.len,
        }
    }

    /// The elements as strings (raw bytes); `None` if this is not a string array.
    pub fn strings(&self) -> Option<impl Iterator<Item = &'a [u8]> + 'a> {
        if self.elem_type != ValueType::String {
            return None;
        }
        Some(self.iter().filter_map(|v| match v {
            Value::String(s) => Some(s),
            _ => None,
        }))
    }

    /// Integer elements of any width as i128; `None` if the elements are not integers or bools.
    pub fn ints(&self) -> Option<Vec<i128>> {
        self.iter().map(|v| v.as_int()).collect()
    }

    /// Float elements (f32/f64, or integers converted); `None` otherwise.
    pub fn floats(&self) -> Option<Vec<f64>> {
        self.iter().map(|v| v.as_f64()).collect()
    }
}

pub struct ArrayIter<'a> {
    cur: Cursor<'a>,
    elem_type: ValueType,
    left: usize,
}

impl<'a> Iterator for ArrayIter<'a> {
    type Item = Value<'a>;
    fn next(&mut self) -> Option<Value<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // The array was validated when the file was opened, so this cannot fail; stop cleanly if it does.
        self.cur.value(self.elem_type, 0).ok()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left))
    }
}

/// Longest string ggml accepts (GGUF_MAX_STRING_LENGTH).
pub const MAX_STRING_LEN: u64 = 1 << 30;
/// Most array elements ggml accepts (GGUF_MAX_ARRAY_ELEMENTS).
pub const MAX_ARRAY_LEN: u64 = 1 << 30;
/// Nesting depth of arrays the reader follows (ggml allows none; gguf-py any).
const MAX_ARRAY_DEPTH: u32 = 4;

/// A bounds-checked little-endian reader over a byte slice; every read fails cleanly past the end.
#[derive(Clone)]
pub(crate) struct Cursor<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) pos: usize,
    pub(crate) v1: bool,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8], v1: bool) -> Self {
        Cursor { buf, pos: 0, v1 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn bytes(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() as u64 {
            return Err(GgufError::Truncated(format!(
                "{what} at byte {} needs {n} bytes, {} left",
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let b = self.bytes(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count, length or dimension: u32 in v1, u64 (read as i64, negatives rejected) since v2.
    pub(crate) fn count(&mut self, what: &str) -> Result<u64, GgufError> {
        if self.v1 {
            return Ok(self.u32(what)? as u64);
        }
        let pos = self.pos;
        let v = self.u64(what)?;
        if v > i64::MAX as u64 {
            return Err(GgufError::Invalid(format!(
                "{what} at byte {pos} is negative ({})",
                v as i64
            )));
        }
        Ok(v)
    }

    pub(crate) fn string(&mut self, what: &str) -> Result<&'a [u8], GgufError> {
        let pos = self.pos;
        let len = self.count(what)?;
        if len > MAX_STRING_LEN {
            return Err(GgufError::Invalid(format!(
                "{what} at byte {pos} claims {len} bytes (limit {MAX_STRING_LEN})"
            )));
        }
        self.bytes(len, what)
    }

    /// Reads one value of type `ty`, validating nested contents (arrays are walked, not materialised).
    pub(crate) fn value(&mut self, ty: ValueType, depth: u32) -> Result<Value<'a>, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>("u8")?[0]),
            ValueType::I8 => Value::I8(self.array::<1>("i8")?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array("u16")?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array("i16")?)),
            ValueType::U32 => Value::U32(self.u32("u32")?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array("i32")?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array("f32")?)),
            ValueType::U64 => Value::U64(self.u64("u64")?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array("i64")?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array("f64")?)),
            ValueType::Bool => {
                let pos = self.pos;
                match self.array::<1>("bool")?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => {
                        return Err(GgufError::Invalid(format!(
                            "bool at byte {pos} has value {b}"
                        )))
                    }
                }
            }
            ValueType::String => Value::String(self.string("string")?),
            ValueType::Array => {
                let pos = self.pos;
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::Invalid(format!(
                        "arrays nested too deep at byte {pos}"
                    )));
                }
                let id = self.u32("array element type")?;
                let elem_type = ValueType::from_id(id).ok_or_else(|| {
                    GgufError::Invalid(format!("array at byte {pos} has unknown element type {id}"))
                })?;
                let len = self.count("array length")?;
                if len > MAX_ARRAY_LEN {
                    return Err(GgufError::Invalid(format!(
                        "array at byte {pos} claims {len} elements (limit {MAX_ARRAY_LEN})"
                    )));
                }
                let start = self.pos;
                match elem_type.fixed_size() {
                    Some(size) => {
                        self.bytes(len * size as u64, "array data")?;
                        if elem_type == ValueType::Bool {
                            let data = &self.buf[start..self.pos];
                            if let Some(i) = data.iter().position(|&b| b > 1) {
                                return Err(GgufError::Invalid(format!(
                                    "bool array element at byte {} has value {}",
                                    start + i,
                                    data[i]
                                )));
                            }
                        }
                    }
                    None => {
                        // Each element has a length prefix of at least 4 bytes: a cheap bound before the walk.
                        if len > self.remaining() as u64 / 4 {
                            return Err(GgufError::Truncated(format!(
                                "array at byte {pos} claims {len} elements but only {} bytes follow",
                                self.remaining()
                            )));
                        }
                        for _ in 0..len {
                            self.value(elem_type, depth + 1)?;
                        }
                    }
                }
                Value::Array(ArrayView {
                    elem_type,
                    len: len as usize,
                    bytes: &self.buf[start..self.pos],
                    v1: self.v1,
                })
            }
        })
    }
}

/// A metadata value owned in memory, for the writer.
#[derive(Clone, Debug, PartialEq)]
pub enum OwnedValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(Vec<u8>),
    /// Element type and elements (which must all be of that type).
    Array(ValueType, Vec<OwnedValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl OwnedValue {
    pub fn value_type(&self) -> ValueType {
        match self {
            OwnedValue::U8(_) => ValueType::U8,
            OwnedValue::I8(_) => ValueType::I8,
            OwnedValue::U16(_) => ValueType::U16,
            OwnedValue::I16(_) => ValueType::I16,
            OwnedValue::U32(_) => ValueType::U32,
            OwnedValue::I32(_) => ValueType::I32,
            OwnedValue::F32(_) => ValueType::F32,
            OwnedValue::Bool(_) => ValueType::Bool,
            OwnedValue::String(_) => ValueType::String,
            OwnedValue::Array(..) => ValueType::Array,
            OwnedValue::U64(_) => ValueType::U64,
            OwnedValue::I64(_) => ValueType::I64,
            OwnedValue::F64(_) => ValueType::F64,
        }
    }

    pub fn str(s: &str) -> OwnedValue {
        OwnedValue::String(s.as_bytes().to_vec())
    }

    pub fn strings<S: AsRef<str>>(items: &[S]) -> OwnedValue {
        OwnedValue::Array(
            ValueType::String,
            items.iter().map(|s| OwnedValue::str(s.as_ref())).collect(),
        )
    }

    /// Appends the encoding (without a type tag) in GGUF v3 form.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        match self {
            OwnedValue::U8(v) => out.push(*v),
            OwnedValue::I8(v) => out.push(*v as u8),
            OwnedValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::Bool(v) => out.push(*v as u8),
            OwnedValue::String(s) => {
                out.extend_from_slice(&(s.len() as u64).to_le_bytes());
                out.extend_from_slice(s);
            }
            OwnedValue::Array(t, items) => {
                out.extend_from_slice(&t.id().to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                for item in items {
                    item.encode(out);
                }
            }
            OwnedValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
}
