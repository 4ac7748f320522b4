-- The sandbox's bounded pattern functions answer exactly as Lua's own: the
-- Lua matcher (used when a call would be too costly for C) and the
-- wrappers are compared with string.find/match/gmatch/gsub on a corpus of
-- subjects, patterns, start positions and replacements, errors included
-- (their messages, not the position each reports).
local patterns = require "tinyloop.policy.patterns"

local SUBJECTS = { "", "hello world", "  key = value  ", "aaab", "a,b,,c", "(foo(bar))baz", "THE (quick) fox",
    "x=1, y=22, z=333", "Bearer sk-abc123", "\0a\0b", "über straße", "1.5e10 -3", "[]^$%" }
local PATTERNS = { "l+", "o", "^h", "d$", "%s*(%S+)%s*=%s*(%S+)", "a-b", "a*", "a?b", ",", "[^,]*", "%b()",
    "%f[%w]%w+", "(%w+)%s(%w+)", "()ll()", "^Bearer%s+(%S+)$", "%d+", "[%a_][%w_]*", "(a)(b)?", "[]]", "[%]]",
    "[a-c]+", "%u+", "(%d)%1", ".-", ".", "", "^", "$", "x*$", "%z", "[^%s]+", "(h)(e)(l)", "%.", "[%^%$]", "%%",
    "(a*(.)%w(%s*))", "[a-", "%", "(()", "%1", "%b(" }
local REPLS = { "<%0>", "%1-%1", "x", "%%", function(x) return x and #tostring(x) end, { a = "A", l = false } }


-- Results of a pcall; an error keeps its message without the position
-- prefix (a C function and Lua code report different positions).
local function pack(...)
    local t = { n = select("#", ...), ... }
    if t[1] == false and type(t[2]) == "string" then
        t[2] = t[2]:gsub("^[^:]*:%d+: ", "")
    end
    return t
end


local function describe_call(name, s, p, x)
    return ("%s(%q, %q, %s)"):format(name, s, p, tostring(x))
end


local function gmatch_all(gmatch, s, p)
    local out = {}
    local ok, err = pcall(function()
        for a, b in gmatch(s, p) do
            out[#out + 1] = tostring(a) .. "|" .. tostring(b)
            if #out > 200 then
                break
            end
        end
    end)
    return pack(ok, ok and table.concat(out, ",") or err)   -- luacheck: ignore
end


for _, impl in ipairs { { "the Lua matcher", patterns.slow }, { "the wrappers", patterns } } do
    local name, P = impl[1], impl[2]
    describe(name, function()
        it("finds and matches as string.find and string.match do", function()
            for _, s in ipairs(SUBJECTS) do
                for _, p in ipairs(PATTERNS) do
                    for _, init in ipairs { 1, 3, -2, 40 } do
                        assert.same(pack(pcall(string.find, s, p, init)), pack(pcall(P.find, s, p, init)),
                            describe_call("find", s, p, init))
                        assert.same(pack(pcall(string.find, s, p, init, true)),
                            pack(pcall(P.find, s, p, init, true)), describe_call("plain find", s, p, init))
                        assert.same(pack(pcall(string.match, s, p, init)), pack(pcall(P.match, s, p, init)),
                            describe_call("match", s, p, init))
                    end
                end
            end
        end)

        it("iterates as string.gmatch does", function()
            for _, s in ipairs(SUBJECTS) do
                for _, p in ipairs(PATTERNS) do
                    assert.same(gmatch_all(string.gmatch, s, p), gmatch_all(P.gmatch, s, p),
                        describe_call("gmatch", s, p))
                end
            end
        end)

        it("replaces as string.gsub does", function()
            for _, s in ipairs(SUBJECTS) do
                for _, p in ipairs(PATTERNS) do
                    for _, r in ipairs(REPLS) do
                        for _, n in ipairs { false, 1, 0 } do
                            assert.same(pack(pcall(string.gsub, s, p, r, n or nil)),
                                pack(pcall(P.gsub, s, p, r, n or nil)), describe_call("gsub", s, p, r))
                        end
                    end
                end
            end
        end)
    end)
end


describe("patterns.steps()", function()
    it("grows with each quantifier and with an unanchored start", function()
        assert.is_true(patterns.steps(1500, ".-.-b", false) > patterns.FAST_STEPS)
        assert.is_true(patterns.steps(100, "^Bearer%s+(%S+)$", true) < patterns.FAST_STEPS)
        assert.equal(3, patterns.quantifiers("a*[b-]+%d?"))
        assert.equal(2, patterns.quantifiers("%b()(x)%1"))
    end)
end)
