-- tinyloop.textstream: turns generated token pieces into text to emit,
-- shared by Model:stream_text and the server's SSE path so both cut text
-- the same way.
--
--   local ts = require "tinyloop.textstream"
--   local d = ts.new({ "\n\n" })          -- stop strings, or nil
--   local text, used = d:push(pieces, n)  -- the pieces of n new tokens
--   if d.stopped then ... end             -- a stop string was found
--   local rest, partial = d:finish()      -- held text; incomplete UTF-8 bytes
--
-- Two things are held back: the bytes of a multi-byte character split
-- across tokens (until it completes; invalid bytes pass, so nothing is held
-- forever), and, with stop strings, the last (longest stop - 1) bytes, which
-- may be the start of a stop string. Text from the stop string on is never
-- emitted. `used` counts the tokens of this push up to and including the
-- one that completes the stop (all n when none does): a usage count that
-- leaves out the tokens the engine made after the stop.
local C = require("tinyloop.lib").load()

local utf8_complete = C.tl_utf8_complete_prefix
local concat, max, type, error, setmetatable = table.concat, math.max, type, error, setmetatable

local _M = {}
local Decoder = {}
Decoder.__index = Decoder


-- The first stop string found in text at or after from -> its start and
-- length (the shorter one on a tie), or nil.
local function find_stop(text, stops, from)
    local best, len
    for i = 1, #stops do
        local a = text:find(stops[i], from, true)
        if a and (not best or a < best or (a == best and #stops[i] < len)) then
            best, len = a, #stops[i]
        end
    end
    return best, len
end
_M.find_stop = find_stop


-- new(stops) -> a decoder. stops: nil, or an array of non-empty strings.
function _M.new(stops)
    local hold = 0
    if stops ~= nil then
        if type(stops) ~= "table" then
            error("textstream.new: stops must be an array of strings, got " .. type(stops), 2)
        end
        for i = 1, #stops do
            local s = stops[i]
            if type(s) ~= "string" or s == "" then
                error("textstream.new: stops[" .. i .. "] must be a non-empty string, got "
                    .. (type(s) == "string" and '""' or type(s)), 2)
            end
            hold = max(hold, #s - 1)
        end
        if #stops == 0 then
            stops = nil
        end
    end
    return setmetatable({
        stops = stops, hold = hold, stopped = false,
        pending = "", -- bytes not yet complete UTF-8
        held = "",    -- complete text held back while a stop string may be forming
        tail = "",    -- the last `hold` bytes of the complete text (where a stop may start)
        done = 0,     -- bytes of complete text so far
        raw = 0,      -- bytes of every piece so far
        ends = {},    -- scratch: raw end offset of each pushed piece
    }, Decoder)
end


-- push(pieces, n) -> text to emit now (maybe ""), tokens counted. pieces:
-- an array with the texts of n tokens (n defaults to #pieces). After a
-- stop, pushes return "", 0.
function Decoder:push(pieces, n)
    n = n or #pieces
    if self.stopped or n == 0 then
        return "", 0
    end
    local ends, raw = self.ends, self.raw
    local raw_before = raw
    for i = 1, n do
        raw = raw + #pieces[i]
        ends[i] = raw
    end
    self.raw = raw
    local pending = self.pending .. (n == 1 and pieces[1] or concat(pieces, "", 1, n))
    local k = utf8_complete(pending, #pending)
    local out = pending:sub(1, k)
    self.pending = pending:sub(k + 1)
    local used = n
    local stops, held = self.stops, self.held
    if stops then
        -- A stop ending in the new text starts at most `hold` bytes before
        -- it, so searching tail .. out finds every new one (only the tail
        -- is kept: a long generation does not grow a string per push).
        local tail = self.tail
        local before = self.done
        local base = before - #tail -- bytes of complete text before `text`
        local text = tail .. out
        self.done = before + #out
        self.tail = text:sub(max(1, #text - self.hold + 1))
        local at, len = find_stop(text, stops, 1)
        if at then
            at = at + base -- from here on, offsets in the whole text
            local stop_end, upto = at + len - 1, 0
            if stop_end > raw_before then
                upto = 1
                while ends[upto] < stop_end do
                    upto = upto + 1
                end
            end
            used = upto
            out = text:sub(before - base + 1, at - base - 1)
            if at - 1 < before then
                -- the stop began inside held-back text
                held = held:sub(1, #held - (before - (at - 1)))
                out = ""
            end
            self.stopped = true
            self.pending = ""
            self.held = ""
            return held .. out, used
        end
    end
    local hold = self.hold
    if hold == 0 then
        return out, used
    end
    local emit = held .. out
    held = emit:sub(max(1, #emit - hold + 1))
    self.held = held
    return emit:sub(1, #emit - #held), used
end


-- finish() -> the held-back text (to emit: no stop string came), and the
-- trailing bytes of an incomplete character (the library's stream_text
-- passes them on; the server drops them). Resets both.
function Decoder:finish()
    local held, partial = self.held, self.pending
    self.held, self.pending = "", ""
    return held, partial
end


_M.Decoder = Decoder
return _M
