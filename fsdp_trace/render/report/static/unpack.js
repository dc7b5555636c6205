// fsdp-trace: data stored in the page packed (fsdp_trace/render/plotlyjs.py), unpacked here,
// synchronously. A packed element is an inert script element of type
// application/x-fsdp-packed with data-packed="M" data-size="N" data-lzma="lc,lp,pb": its text
// holds a raw LZMA1 stream of M bytes, 7 bits a character (a character from U+0100 carries two
// 7-bit groups: one of ESCAPED, the values unsafe as a character of their own in a page, then
// any value); N is the unpacked size. Browsers' DecompressionStream knows only deflate, which
// leaves plotly.js too large; so LZMA, decoded by the lines below (written after the LZMA
// specification; no third-party code). No closing script tag may appear in this file.
var fsdpUnpack = (function () {
  "use strict";
  var ESCAPED = [0, 10, 13, 60];

  function groups(text, size) {
    var out = new Uint8Array(size), n = 0, acc = 0, have = 0;
    function push(v) {
      acc = (acc << 7) | v;
      have += 7;
      if (have >= 8) {
        have -= 8;
        if (n < size) out[n++] = (acc >>> have) & 255;
        acc &= (1 << have) - 1;
      }
    }
    for (var i = 0; i < text.length && n < size; i++) {
      var c = text.charCodeAt(i);
      if (c < 128) {
        push(c);
      } else {
        c -= 256;
        push(ESCAPED[c >> 7]);
        push(c & 127);
      }
    }
    if (n !== size) throw new Error("fsdp-trace: packed data is truncated");
    return out;
  }

  function lzma(input, size, lc, lp, pb) {
    var out = new Uint8Array(size), pos = 0, at = 0, range = 0xffffffff, code = 0;
    function probs(n) { return new Uint16Array(n).fill(1024); }
    var literal = probs(0x300 << (lc + lp)), isMatch = probs(192), isRep = probs(12);
    var isRepG0 = probs(12), isRepG1 = probs(12), isRepG2 = probs(12), isRep0Long = probs(192);
    var posSlot = probs(256), posSpecial = probs(115), align = probs(16);
    var matchLen = probs(514), repLen = probs(514);

    function next() {
      if (at >= input.length) throw new Error("fsdp-trace: LZMA data ended early");
      return input[at++];
    }
    function bit(p, i) {
      var v = p[i], bound = (range >>> 11) * v, b;
      if (code < bound) {
        range = bound;
        p[i] = v + ((2048 - v) >>> 5);
        b = 0;
      } else {
        range -= bound;
        code -= bound;
        p[i] = v - (v >>> 5);
        b = 1;
      }
      if (range < 0x1000000) {
        range = (range * 256) >>> 0;
        code = ((code * 256) + next()) >>> 0;
      }
      return b;
    }
    function tree(p, base, bits) {
      var m = 1;
      for (var i = 0; i < bits; i++) m = (m << 1) | bit(p, base + m);
      return m - (1 << bits);
    }
    function reverse(p, base, bits) {
      var m = 1, symbol = 0;
      for (var i = 0; i < bits; i++) {
        var b = bit(p, base + m);
        m = (m << 1) | b;
        symbol |= b << i;
      }
      return symbol;
    }
    function direct(bits) {
      var result = 0;
      for (var i = 0; i < bits; i++) {
        range = range >>> 1;
        var b = code >= range ? 1 : 0;
        if (b) code -= range;
        result = result * 2 + b;
        if (range < 0x1000000) {
          range = (range * 256) >>> 0;
          code = ((code * 256) + next()) >>> 0;
        }
      }
      return result;
    }
    function length(p, posState) {
      if (!bit(p, 0)) return tree(p, 2 + posState * 8, 3);
      if (!bit(p, 1)) return 8 + tree(p, 130 + posState * 8, 3);
      return 16 + tree(p, 258, 8);
    }
    function distance(len) {
      var slot = tree(posSlot, (len < 3 ? len : 3) * 64, 6);
      if (slot < 4) return slot;
      var bits = (slot >>> 1) - 1, dist = (2 | (slot & 1)) * Math.pow(2, bits);
      if (slot < 14) return dist + reverse(posSpecial, dist - slot, bits);
      return dist + direct(bits - 4) * 16 + reverse(align, 0, 4);
    }

    if (next() !== 0) throw new Error("fsdp-trace: not an LZMA stream");
    for (var i = 0; i < 4; i++) code = ((code * 256) + next()) >>> 0;
    var state = 0, rep0 = 0, rep1 = 0, rep2 = 0, rep3 = 0;
    var pbMask = (1 << pb) - 1, lpMask = (1 << lp) - 1;
    while (pos < size) {
      var posState = pos & pbMask, len;
      if (!bit(isMatch, (state << 4) + posState)) {
        var prev = pos > 0 ? out[pos - 1] : 0;
        var base = 0x300 * (((pos & lpMask) << lc) + (prev >>> (8 - lc)));
        var symbol = 1;
        if (state >= 7) {
          var match = out[pos - rep0 - 1];
          do {
            var matchBit = (match >>> 7) & 1;
            match <<= 1;
            var b = bit(literal, base + ((1 + matchBit) << 8) + symbol);
            symbol = (symbol << 1) | b;
            if (matchBit !== b) break;
          } while (symbol < 0x100);
        }
        while (symbol < 0x100) symbol = (symbol << 1) | bit(literal, base + symbol);
        out[pos++] = symbol - 0x100;
        state = state < 4 ? 0 : state < 10 ? state - 3 : state - 6;
        continue;
      }
      if (bit(isRep, state)) {
        if (pos === 0) throw new Error("fsdp-trace: LZMA data is damaged");
        if (!bit(isRepG0, state)) {
          if (!bit(isRep0Long, (state << 4) + posState)) {
            state = state < 7 ? 9 : 11;
            out[pos] = out[pos - rep0 - 1];
            pos++;
            continue;
          }
        } else {
          var dist;
          if (!bit(isRepG1, state)) {
            dist = rep1;
          } else {
            if (!bit(isRepG2, state)) {
              dist = rep2;
            } else {
              dist = rep3;
              rep3 = rep2;
            }
            rep2 = rep1;
          }
          rep1 = rep0;
          rep0 = dist;
        }
        len = length(repLen, posState);
        state = state < 7 ? 8 : 11;
      } else {
        rep3 = rep2;
        rep2 = rep1;
        rep1 = rep0;
        len = length(matchLen, posState);
        state = state < 7 ? 7 : 10;
        rep0 = distance(len);
        if (rep0 === 0xffffffff) break; // the end marker
        if (rep0 >= pos) throw new Error("fsdp-trace: LZMA data is damaged");
      }
      var from = pos - rep0 - 1, end = Math.min(pos + len + 2, size);
      while (pos < end) out[pos++] = out[from++];
    }
    if (pos !== size) throw new Error("fsdp-trace: LZMA data is damaged");
    return out;
  }

  // The unpacked bytes of a packed element.
  function bytes(element) {
    var props = element.getAttribute("data-lzma").split(",").map(Number);
    var packed = groups(element.textContent, Number(element.getAttribute("data-packed")));
    return lzma(packed, Number(element.getAttribute("data-size")), props[0], props[1], props[2]);
  }

  return {
    lzma: lzma,
    groups: groups,
    bytes: bytes,
    // The element's content as text (UTF-8).
    text: function (element) { return new TextDecoder("utf-8").decode(bytes(element)); }
  };
})();
