-- Bounded Lua patterns for the policy sandbox (see tinyloop.policy.sandbox).
--
-- string.find/match/gmatch/gsub are C functions: the sandbox's instruction
-- hook never fires inside them, and a backtracking pattern such as
-- ("a"):rep(1500):find(".-.-b") runs for seconds. Each wrapper here
-- estimates the work of a call from the subject length and the pattern's
-- quantifiers (n ^ quantifiers, times n when unanchored); a cheap call
-- goes to the C function, an expensive one to a port of Lua 5.1's matcher
-- (lstrlib.c) written in Lua and kept out of the JIT, so the instruction
-- limit, the memory cap and the time budget bound it like any policy code.
-- Results are the same either way. gsub builds its result under the
-- sandbox's string size cap.
local jit = require "jit"

local _M = {}

local byte, sub, char, s_find = string.byte, string.sub, string.char, string.find
local s_match, s_gmatch, s_gsub = string.match, string.gmatch, string.gsub
local type, tostring, tonumber, error, concat = type, tostring, tonumber, error, table.concat
local log = math.log

-- A C call estimated below this many steps runs in C (~20 ms at worst);
-- charge(steps / 32) counts it against the caller's instruction budget.
_M.FAST_STEPS = 2 ^ 24
_M.MAX_STRING = 1048576     -- largest gsub result (set by the sandbox)
_M.charge = function() end  -- set by the sandbox
local MAXCAPTURES = 32
local CAP_UNFINISHED, CAP_POSITION = -1, -2
local ESC, LBRACKET, RBRACKET, CARET, DOLLAR = 37, 91, 93, 94, 36


-- ---- cost estimate --------------------------------------------------------------------------

-- quantifiers(p) -> how many backtracking points the pattern has: *, +, -
-- and ? after a single-character class, %b, and back references.
local function quantifiers(p)
    local q, i, n = 0, 1, #p
    while i <= n do
        local c = byte(p, i)
        local item_end
        if c == ESC then
            local d = byte(p, i + 1)
            if d == 98 then                                  -- %bxy
                q = q + 1
                i = i + 4
            elseif d == 102 then                             -- %f[set]
                i = i + 2
            elseif d and d >= 49 and d <= 57 then            -- %1..%9
                q = q + 1
                i = i + 2
            else
                item_end = i + 2
            end
        elseif c == LBRACKET then
            local j = i + 1
            if byte(p, j) == CARET then
                j = j + 1
            end
            repeat
                if j > n then
                    return q     -- malformed: the matcher says so
                end
                local cc = byte(p, j)
                j = j + 1
                if cc == ESC and j <= n then
                    j = j + 1
                end
            until byte(p, j) == RBRACKET
            item_end = j + 1
        else
            item_end = i + 1
        end
        if item_end then
            local nx = byte(p, item_end)
            if nx == 42 or nx == 43 or nx == 45 or nx == 63 then     -- * + - ?
                q = q + 1
                item_end = item_end + 1
            end
            i = item_end
        end
    end
    return q
end
_M.quantifiers = quantifiers


-- steps(n, p, anchored) -> an upper estimate of the matcher's steps on n bytes.
local function steps(n, p, anchored)
    n = n + 1
    local e = quantifiers(p) + (anchored and 0 or 1)
    local lg = e * log(n) + log(#p + 1)
    if lg > 700 then
        return math.huge
    end
    return math.exp(lg)
end
_M.steps = steps


-- ---- the matcher (lstrlib.c, Lua 5.1) ---------------------------------------------------------

local CLASS = {}
do
    for _, cl in ipairs { "a", "c", "d", "l", "p", "s", "u", "w", "x", "z" } do
        local set, neg = {}, {}
        for b = 0, 255 do
            local m = s_find(char(b), "^%" .. cl) ~= nil
            set[b], neg[b] = m, not m
        end
        CLASS[byte(cl)], CLASS[byte(cl:upper())] = set, neg
    end
end


local function match_class(c, cl)
    local set = CLASS[cl]
    if set then
        return set[c]
    end
    return cl == c
end


local function class_end(ms, p)
    local pat = ms.pat
    local c = byte(pat, p)
    p = p + 1
    if c == ESC then
        if p > ms.plen then
            error("malformed pattern (ends with '%')", 0)
        end
        return p + 1
    elseif c == LBRACKET then
        if byte(pat, p) == CARET then
            p = p + 1
        end
        repeat
            if p > ms.plen then
                error("malformed pattern (missing ']')", 0)
            end
            local cc = byte(pat, p)
            p = p + 1
            if cc == ESC and p <= ms.plen then
                p = p + 1
            end
        until byte(pat, p) == RBRACKET
        return p + 1
    end
    return p
end


local function match_bracket(ms, c, p, ec)
    local pat = ms.pat
    local sig = true
    if byte(pat, p + 1) == CARET then
        sig = false
        p = p + 1
    end
    p = p + 1
    while p < ec do
        local pc = byte(pat, p)
        if pc == ESC then
            p = p + 1
            if match_class(c, byte(pat, p)) then
                return sig
            end
        elseif byte(pat, p + 1) == 45 and p + 2 < ec then
            if pc <= c and c <= byte(pat, p + 2) then
                return sig
            end
            p = p + 2
        elseif pc == c then
            return sig
        end
        p = p + 1
    end
    return not sig
end


local function single_match(ms, s, p, ep)
    if s > ms.slen then
        return false
    end
    local c = byte(ms.src, s)
    local pc = byte(ms.pat, p)
    if pc == 46 then            -- .
        return true
    elseif pc == ESC then
        return match_class(c, byte(ms.pat, p + 1))
    elseif pc == LBRACKET then
        return match_bracket(ms, c, p, ep - 1)
    end
    return pc == c
end


local do_match


local function max_expand(ms, s, p, ep)
    local i = 0
    while single_match(ms, s + i, p, ep) do
        i = i + 1
    end
    while i >= 0 do
        local res = do_match(ms, s + i, ep + 1)
        if res then
            return res
        end
        i = i - 1
    end
    return nil
end


local function min_expand(ms, s, p, ep)
    while true do
        local res = do_match(ms, s, ep + 1)
        if res then
            return res
        elseif single_match(ms, s, p, ep) then
            s = s + 1
        else
            return nil
        end
    end
end


local function start_capture(ms, s, p, what)
    local level = ms.level
    if level >= MAXCAPTURES then
        error("too many captures", 0)
    end
    ms.cinit[level], ms.clen[level] = s, what
    ms.level = level + 1
    local res = do_match(ms, s, p)
    if not res then
        ms.level = ms.level - 1
    end
    return res
end


local function end_capture(ms, s, p)
    local l = ms.level - 1
    while l >= 0 and ms.clen[l] ~= CAP_UNFINISHED do
        l = l - 1
    end
    if l < 0 then
        error("invalid pattern capture", 0)
    end
    ms.clen[l] = s - ms.cinit[l]
    local res = do_match(ms, s, p)
    if not res then
        ms.clen[l] = CAP_UNFINISHED
    end
    return res
end


local function check_capture(ms, l)
    l = l - 49
    if l < 0 or l >= ms.level or ms.clen[l] == CAP_UNFINISHED then
        error("invalid capture index", 0)
    end
    return l
end


local function match_capture(ms, s, l)
    l = check_capture(ms, l)
    local len = ms.clen[l]
    if ms.slen - s + 1 >= len and sub(ms.src, ms.cinit[l], ms.cinit[l] + len - 1) == sub(ms.src, s, s + len - 1) then
        return s + len
    end
    return nil
end


local function match_balance(ms, s, p)
    if p + 1 > ms.plen then
        error("unbalanced pattern", 0)
    end
    local src = ms.src
    if s > ms.slen or byte(src, s) ~= byte(ms.pat, p) then
        return nil
    end
    local b, e, cont = byte(ms.pat, p), byte(ms.pat, p + 1), 1
    s = s + 1
    while s <= ms.slen do
        local c = byte(src, s)
        if c == e then
            cont = cont - 1
            if cont == 0 then
                return s + 1
            end
        elseif c == b then
            cont = cont + 1
        end
        s = s + 1
    end
    return nil
end


-- do_match(ms, s, p) -> the index after the match of pattern[p..] at s, or nil.
function do_match(ms, s, p)
    local pat = ms.pat
    while true do
        if p > ms.plen then
            return s
        end
        local pc = byte(pat, p)
        local default = false
        if pc == 40 then                                     -- (
            if byte(pat, p + 1) == 41 then
                return start_capture(ms, s, p + 2, CAP_POSITION)
            end
            return start_capture(ms, s, p + 1, CAP_UNFINISHED)
        elseif pc == 41 then                                 -- )
            return end_capture(ms, s, p + 1)
        elseif pc == ESC then
            local d = byte(pat, p + 1)
            if d == 98 then                                  -- %b
                s = match_balance(ms, s, p + 2)
                if not s then
                    return nil
                end
                p = p + 4
            elseif d == 102 then                             -- %f
                p = p + 2
                if byte(pat, p) ~= LBRACKET then
                    error("missing '[' after '%f' in pattern", 0)
                end
                local ep = class_end(ms, p)
                local prev = s == 1 and 0 or byte(ms.src, s - 1)
                local cur = byte(ms.src, s) or 0
                if match_bracket(ms, prev, p, ep - 1) or not match_bracket(ms, cur, p, ep - 1) then
                    return nil
                end
                p = ep
            elseif d and d >= 48 and d <= 57 then            -- %0..%9
                s = match_capture(ms, s, d)
                if not s then
                    return nil
                end
                p = p + 2
            else
                default = true
            end
        elseif pc == DOLLAR and p == ms.plen then
            return s == ms.slen + 1 and s or nil
        else
            default = true
        end
        if default then
            local ep = class_end(ms, p)
            local m = single_match(ms, s, p, ep)
            local q = byte(pat, ep)
            if q == 63 then                                  -- ?
                if m then
                    local res = do_match(ms, s + 1, ep + 1)
                    if res then
                        return res
                    end
                end
                p = ep + 1
            elseif q == 42 then                              -- *
                return max_expand(ms, s, p, ep)
            elseif q == 43 then                              -- +
                return m and max_expand(ms, s + 1, p, ep) or nil
            elseif q == 45 then                              -- -
                return min_expand(ms, s, p, ep)
            else
                if not m then
                    return nil
                end
                s = s + 1
                p = ep
            end
        end
    end
end


local function one_capture(ms, i, s, e)
    if i >= ms.level then
        if i == 0 then
            return sub(ms.src, s, e - 1)
        end
        error("invalid capture index", 0)
    end
    local l = ms.clen[i]
    if l == CAP_UNFINISHED then
        error("unfinished capture", 0)
    elseif l == CAP_POSITION then
        return ms.cinit[i]
    end
    return sub(ms.src, ms.cinit[i], ms.cinit[i] + l - 1)
end


local function captures(ms, s, e, whole)
    local n = (ms.level == 0 and whole) and 1 or ms.level
    local out = {}
    for i = 0, n - 1 do
        out[i + 1] = one_capture(ms, i, s, e)
    end
    return out, n
end


local function state(src, pat)
    local z = s_find(pat, "\0", 1, true)     -- 5.1 patterns end at a NUL
    if z then
        pat = sub(pat, 1, z - 1)
    end
    return { src = src, slen = #src, pat = pat, plen = #pat, level = 0, cinit = {}, clen = {} }
end


local function start_of(init, len)
    init = init or 1
    if init < 0 then
        init = len + init + 1
    end
    if init < 1 then
        init = 1
    elseif init > len + 1 then
        init = len + 1
    end
    return init
end


-- find_aux(find, s, p, init) -> like string.find (find) or string.match.
local function find_aux(find, src, pat, init)
    init = start_of(init, #src)
    local ms = state(src, pat)
    local p = 1
    local anchor = byte(ms.pat, 1) == CARET
    if anchor then
        p = 2
    end
    local s1 = init
    repeat
        ms.level = 0
        local e = do_match(ms, s1, p)
        if e then
            if find then
                local caps, n = captures(ms, nil, nil, false)
                return s1, e - 1, unpack(caps, 1, n)
            end
            local caps, n = captures(ms, s1, e, true)
            return unpack(caps, 1, n)
        end
        s1 = s1 + 1
    until s1 > ms.slen + 1 or anchor
    return nil
end


local function lua_gmatch(src, pat)
    local ms = state(src, pat)
    local pos = 1
    return function()
        local s1 = pos
        while s1 <= ms.slen + 1 do
            ms.level = 0
            local e = do_match(ms, s1, 1)
            if e then
                pos = e == s1 and e + 1 or e
                local caps, n = captures(ms, s1, e, true)
                return unpack(caps, 1, n)
            end
            s1 = s1 + 1
        end
        pos = s1
        return nil
    end
end


local function lua_gsub(src, pat, repl, max_n)
    local ms = state(src, pat)
    local p = 1
    local anchor = byte(ms.pat, 1) == CARET
    if anchor then
        p = 2
    end
    local tr = type(repl)
    local out, size, n, s = {}, 0, 0, 1
    max_n = max_n or ms.slen + 1
    local function add(piece)
        size = size + #piece
        if size > _M.MAX_STRING then
            error(("string.gsub result too large (more than %d bytes)"):format(_M.MAX_STRING), 0)
        end
        out[#out + 1] = piece
    end
    while n < max_n do
        ms.level = 0
        local e = do_match(ms, s, p)
        if e then
            n = n + 1
            local whole = sub(src, s, e - 1)
            local v
            if tr == "string" or tr == "number" then
                local r, parts, i = tostring(repl), {}, 1
                while i <= #r do
                    local c = byte(r, i)
                    if c == ESC then
                        i = i + 1
                        local d = byte(r, i)
                        if d == 48 then
                            parts[#parts + 1] = whole
                        elseif d and d >= 49 and d <= 57 then
                            parts[#parts + 1] = tostring(one_capture(ms, d - 49, s, e))
                        elseif d then
                            parts[#parts + 1] = char(d)
                        end
                    else
                        parts[#parts + 1] = char(c)
                    end
                    i = i + 1
                end
                v = concat(parts)
            elseif tr == "function" then
                local caps, k = captures(ms, s, e, true)
                v = repl(unpack(caps, 1, k))
            else
                v = repl[one_capture(ms, 0, s, e)]
            end
            if v == nil or v == false then
                v = whole
            elseif type(v) ~= "string" and type(v) ~= "number" then
                error("invalid replacement value (a " .. type(v) .. ")", 0)
            end
            add(tostring(v))
        end
        if e and e > s then
            s = e
        elseif s <= ms.slen then
            add(sub(src, s, s))
            s = s + 1
        else
            break
        end
        if anchor then
            break
        end
    end
    if s <= ms.slen then
        add(sub(src, s))
    end
    return concat(out), n
end


-- ---- the wrappers ----------------------------------------------------------------------------

local SPECIALS = "[%^%$%*%+%?%.%(%[%%%-]"


local function subject(s)
    if type(s) == "number" then
        return tostring(s)
    end
    return s
end


-- Plain search is memchr + memcmp: n * m in the worst case. Here each
-- candidate is compared 64 bytes at a time, so the hook sees the work.
local function lua_plain_find(s, p, init)
    local n, m = #s, #p
    for i = init, n - m + 1 do
        local j = 0
        while j < m do
            local k = m - j < 64 and m - j or 64
            if sub(s, i + j, i + j + k - 1) ~= sub(p, j + 1, j + k) then
                break
            end
            j = j + k
        end
        if j >= m then
            return i, i + m - 1
        end
    end
    return nil
end


local function number_arg(x)
    if type(x) == "string" then
        return tonumber(x) or x
    end
    return x
end


function _M.find(s, p, init, plain)
    s, p, init = subject(s), subject(p), number_arg(init)
    if type(s) ~= "string" or type(p) ~= "string" or (init ~= nil and type(init) ~= "number") then
        return s_find(s, p, init, plain)     -- the C function raises the usual error
    end
    local from = start_of(init, #s)
    local n = #s - from + 1
    if plain or not s_find(p, SPECIALS) then
        if n * #p <= _M.FAST_STEPS * 16 then
            _M.charge(n * #p / 512)
            return s_find(s, p, init, true)
        end
        if #p == 0 then
            return from, from - 1
        end
        return lua_plain_find(s, p, from)
    end
    local st = steps(n, p, byte(p, 1) == CARET)
    if st <= _M.FAST_STEPS then
        _M.charge(st / 32)
        return s_find(s, p, init)
    end
    return find_aux(true, s, p, init)
end


function _M.match(s, p, init)
    s, p, init = subject(s), subject(p), number_arg(init)
    if type(s) ~= "string" or type(p) ~= "string" or (init ~= nil and type(init) ~= "number") then
        return s_match(s, p, init)
    end
    local n = #s - start_of(init, #s) + 1
    local st = steps(n, p, byte(p, 1) == CARET)
    if st <= _M.FAST_STEPS then
        _M.charge(st / 32)
        return s_match(s, p, init)
    end
    return find_aux(false, s, p, init)
end


function _M.gmatch(s, p)
    s, p = subject(s), subject(p)
    if type(s) ~= "string" or type(p) ~= "string" then
        return s_gmatch(s, p)
    end
    local st = steps(#s, p, false)
    if st <= _M.FAST_STEPS then
        _M.charge(st / 32)
        return s_gmatch(s, p)
    end
    return lua_gmatch(s, p)
end


-- The largest result a string replacement can build: each match adds the
-- replacement, and its %0..%9 add at most the subject in all (matches do
-- not overlap).
local function gsub_bound(n, repl, max_n)
    local r = tostring(repl)
    local _, refs = s_gsub(r, "%%%d", "")
    local matches = math.min(n + 1, max_n or n + 1)
    return n + matches * #r + refs * n
end


function _M.gsub(s, p, repl, max_n)
    s, p, max_n = subject(s), subject(p), number_arg(max_n)
    local tr = type(repl)
    if type(s) ~= "string" or type(p) ~= "string" or (max_n ~= nil and type(max_n) ~= "number")
        or not (tr == "string" or tr == "number" or tr == "table" or tr == "function") then
        return s_gsub(s, p, repl, max_n)
    end
    local st = steps(#s, p, byte(p, 1) == CARET)
    -- A string replacement runs in C when its result is at most 16 times
    -- the cap (it is then measured); anything else builds under the cap.
    if st <= _M.FAST_STEPS and (tr == "string" or tr == "number")
        and gsub_bound(#s, repl, max_n) <= 16 * _M.MAX_STRING then
        _M.charge(st / 32)
        local out, n = s_gsub(s, p, repl, max_n)
        if #out > _M.MAX_STRING then
            error(("string.gsub result too large (%d bytes > %d)"):format(#out, _M.MAX_STRING), 2)
        end
        return out, n
    end
    return lua_gsub(s, p, repl, max_n and math.floor(max_n))
end


-- The Lua matcher alone, for tests that compare it with the C functions.
_M.slow = {
    find = function(s, p, init, plain)
        if plain then
            return lua_plain_find(s, p, start_of(init, #s))
        end
        return find_aux(true, s, p, init)
    end,
    match = function(s, p, init) return find_aux(false, s, p, init) end,
    gmatch = lua_gmatch,
    gsub = lua_gsub,
}


-- Everything here runs interpreted: the count hook sees its work.
for _, f in pairs(_M) do
    if type(f) == "function" then
        jit.off(f, true)
    end
end
for _, f in ipairs { quantifiers, steps, class_end, match_bracket, single_match, max_expand, min_expand,
                     start_capture, end_capture, check_capture, match_capture, match_balance, do_match, one_capture,
                     captures, state, find_aux, lua_gmatch, lua_gsub, lua_plain_find, gsub_bound, number_arg, subject,
                     start_of, match_class } do
    jit.off(f, true)
end


return _M
