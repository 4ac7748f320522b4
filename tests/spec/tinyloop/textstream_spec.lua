-- tinyloop.textstream: the one UTF-8 / stop-string decoder behind
-- Model:stream_text and the server's SSE path (issue 16).
describe("tinyloop.textstream", function()
    local ts = require "tinyloop.textstream"

    -- Pushes pieces in the given batches; returns the emitted text, the
    -- tokens counted and the decoder.
    local function run(stops, batches)
        local d = ts.new(stops)
        local out, used = {}, 0
        for _, b in ipairs(batches) do
            local text, u = d:push(b)
            out[#out + 1] = text
            used = used + u
        end
        local held = d:finish()
        out[#out + 1] = held
        return table.concat(out), used, d
    end

    it("holds back a character split across tokens until it completes", function()
        local d = ts.new()
        assert.are.equal("a", d:push({ "a\xc3" }))
        assert.are.equal("\xc3\xa9b", d:push({ "\xa9b" }))
        local held, partial = d:finish()
        assert.are.equal("", held)
        assert.are.equal("", partial)
    end)

    it("hands an incomplete last character to finish() as partial bytes", function()
        local d = ts.new()
        assert.are.equal("x", d:push({ "x\xe2\x82" }))
        local held, partial = d:finish()
        assert.are.equal("", held)
        assert.are.equal("\xe2\x82", partial)
    end)

    it("passes invalid bytes through instead of holding them forever", function()
        local d = ts.new()
        assert.are.equal("\xff\xfe", d:push({ "\xff\xfe" }))
    end)

    it("holds back text that may be the start of a stop string", function()
        local d = ts.new({ "END" })
        assert.are.equal("", d:push({ "hi" }))   -- "hi" could be followed by nothing yet: held (2 bytes)
        assert.are.equal("hi", d:push({ " E" })) -- " E" may start "END"
        assert.are.equal(" E", (d:finish()))
    end)

    it("never emits the stop string or what follows, across tokens", function()
        local text, used, d = run({ "END" }, { { "one " }, { "E" }, { "N" }, { "Dtwo" }, { "three" } })
        assert.are.equal("one ", text)
        assert.is_true(d.stopped)
        -- the token that completes the stop is counted, the one after it is not
        assert.are.equal(4, used)
    end)

    it("counts tokens up to the completing one inside a batch", function()
        local text, used = run({ "\n\n" }, { { "a", "\n", "\n", "b", "c" } })
        assert.are.equal("a", text)
        assert.are.equal(3, used)
    end)

    it("finds a stop that began in held-back text", function()
        local text, used = run({ "STOP" }, { { "xyST" }, { "OPz" } })
        assert.are.equal("xy", text)
        assert.are.equal(2, used)
    end)

    it("prefers the earliest stop, the shorter on a tie", function()
        assert.are.equal("a", (run({ "bc", "b" }, { { "abcd" } })))
        assert.are.equal("a", (run({ "cd", "b" }, { { "abcd" } })))
    end)

    it("gives the same text whatever the batching", function()
        local pieces = { "Hel", "lo", " w\xc3", "\xb6rld", "\n\n", "tail" }
        local one = {}
        for i, p in ipairs(pieces) do one[i] = { p } end
        for _, stops in ipairs({ false, { "\n\n" }, { "w\xc3\xb6" }, { "zz" } }) do
            local s = stops or nil
            local a, ua = run(s, one)
            local b, ub = run(s, { pieces })
            assert.are.equal(a, b)
            assert.are.equal(ua, ub)
        end
    end)

    it("matches a whole-text search on random token streams", function()
        -- one stop string: the text is everything before its first
        -- occurrence, the count the tokens up to the one that completes it
        local alphabet = { "a", "b", "c", "ab", "bc", " ", "\xc3\xa9", "\xc3", "\xa9", "abc" }
        math.randomseed(16)
        for _ = 1, 300 do
            local pieces, batches = {}, {}
            local batch = {}
            for i = 1, math.random(1, 40) do
                pieces[i] = alphabet[math.random(#alphabet)]
                batch[#batch + 1] = pieces[i]
                if math.random() < 0.4 then
                    batches[#batches + 1], batch = batch, {}
                end
            end
            batches[#batches + 1] = batch
            local stop = ({ "abc", "ca", "c\xc3\xa9", " a b" })[math.random(4)]
            local full = table.concat(pieces)
            local at = full:find(stop, 1, true)
            local want, want_used = full, #pieces
            if at then
                want = full:sub(1, at - 1)
                local stop_end, len = at + #stop - 1, 0
                for i = 1, #pieces do
                    len = len + #pieces[i]
                    if len >= stop_end then
                        want_used = i
                        break
                    end
                end
            end
            local d = ts.new({ stop })
            local got, used = {}, 0
            for _, b in ipairs(batches) do
                local text, u = d:push(b)
                got[#got + 1] = text
                used = used + u
            end
            local held, partial = d:finish()
            got = table.concat(got) .. held .. (at and "" or partial)
            assert.are.equal(want, got)
            assert.are.equal(want_used, used)
            assert.are.equal(at ~= nil, d.stopped)
        end
    end)

    it("refuses stops that are not non-empty strings", function()
        assert.has_error(function() ts.new("x") end, "textstream.new: stops must be an array of strings, got string")
        assert.has_error(function() ts.new({ "" }) end, 'textstream.new: stops[1] must be a non-empty string, got ""')
        assert.has_error(function() ts.new({ 3 }) end, "textstream.new: stops[1] must be a non-empty string, got number")
    end)
end)
