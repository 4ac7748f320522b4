-- The KV tiers under the arena through the Lua API on stories260K: the
-- kv_dir / kv_host_mem / kv_disk_mem options and their checks, stats().tiers,
-- an evicted prompt brought back from host RAM and from disk with the same
-- greedy tokens, save_cache / load_cache for a warm restart and the report
-- of a corrupted file, set_spill_policy. tests/c/test_kv_tier.c and
-- test_kv_file.c cover the tiers and the block files themselves.
local helpers = require "helpers"

describe("KV tiers", function()
    if helpers.skip_without_model() then
        return
    end
    local tl = require "tinyloop"
    local path = helpers.model_path
    local greedy = { max_tokens = 8, temperature = 0 }
    -- 100 blocks of 16 positions over 5 layers: 320 tokens of prefixes, so
    -- a dozen prompts of 100 tokens evict the first.
    local SMALL = 200 * 1024

    -- A prompt of n distinct-looking ids, different for each seed.
    local function prompt(seed, n)
        local t = { 1 }
        for i = 1, (n or 100) do
            t[#t + 1] = (i * 37 + seed * 101) % 500 + 3
        end
        return t
    end

    local opened, dirs = {}, {}
    local function open(opts)
        local m = tl.Model(path, opts)
        opened[#opened + 1] = m
        return m
    end
    local function tmpdir()
        local d = helpers.tmpdir()
        dirs[#dirs + 1] = d
        return d
    end
    local function files(dir)
        local out = {}
        local p = io.popen("ls '" .. dir .. "'")
        for name in p:lines() do
            out[#out + 1] = name
        end
        p:close()
        return out
    end
    -- Generates prompt(1), evicts it with other prompts, returns its tokens.
    local function fill_and_evict(m)
        local first = assert(m:generate(prompt(1), greedy))
        for k = 2, 13 do
            assert(m:generate(prompt(k), greedy))
        end
        return first
    end

    after_each(function()
        for i = #opened, 1, -1 do
            opened[i]:close()
            opened[i] = nil
        end
        for i = #dirs, 1, -1 do
            os.execute("rm -rf '" .. dirs[i] .. "'")
            dirs[i] = nil
        end
    end)

    describe("options", function()
        it("rejects a kv_dir that is not a non-empty string, naming it", function()
            for _, v in ipairs { 3, true, "" } do
                assert.has_error(function() tl.Model(path, { kv_dir = v }) end,
                    "bad argument 'kv_dir' to Model (expected a directory path (a non-empty string), got "
                    .. (type(v) == "string" and string.format("%q", v) or tostring(v)) .. ")")
            end
        end)

        it("rejects byte counts that are not integers >= 0, naming the option and value", function()
            for _, name in ipairs { "kv_host_mem", "kv_disk_mem", "kv_mem" } do
                for _, v in ipairs { -1, 1.5, "1M", true, math.huge } do
                    assert.has_error(function() tl.Model(path, { [name] = v }) end,
                        "bad argument '" .. name .. "' to Model (expected a byte count >= 0, got "
                        .. (type(v) == "string" and string.format("%q", v) or tostring(v)) .. ")")
                end
            end
        end)

        it("opens without tiers by default: every tier figure is 0", function()
            local m = open { kv_mem = SMALL }
            assert.is_nil(m.kv_dir)
            local t = m:stats().tiers
            for _, name in ipairs { "host", "disk" } do
                for _, k in ipairs { "blocks", "bytes", "budget", "spills", "spill_bytes", "hits", "restore_bytes",
                    "refused", "dropped", "spill_ms", "restore_ms" } do
                    assert.are.equal(0, t[name][k], name .. "." .. k)
                end
            end
            assert.are.equal(0, t.restored_tokens)
            assert.are.equal(0, t.recomputed)
        end)

        it("reports the budgets it was given", function()
            local dir = tmpdir()
            local m = open { kv_mem = SMALL, kv_dir = dir, kv_host_mem = 1048576, kv_disk_mem = 8388608 }
            assert.are.equal(dir, m.kv_dir)
            local t = m:stats().tiers
            assert.are.equal(1048576, t.host.budget)
            assert.are.equal(8388608, t.disk.budget)
        end)
    end)

    describe("an evicted prompt", function()
        it("comes back from host RAM with the same greedy tokens", function()
            local m = open { kv_mem = SMALL, kv_host_mem = 4 * 1048576 }
            local first = fill_and_evict(m)
            local t = m:stats().tiers
            assert.is_true(t.host.spills > 0 and t.host.blocks > 0 and t.host.bytes > 0, "spilled to host")
            assert.are.same(first, m:generate(prompt(1), greedy))
            t = m:stats().tiers
            assert.is_true(t.host.hits > 0, "host hits")
            assert.is_true(t.restored_tokens > 0, "restored tokens")
            assert.are.equal(0, t.disk.spills)
        end)

        it("comes back from disk with the same greedy tokens", function()
            local dir = tmpdir()
            local m = open { kv_mem = SMALL, kv_dir = dir }
            local first = fill_and_evict(m)
            local t = m:stats().tiers
            assert.is_true(t.disk.spills > 0, "spilled to disk")
            assert.is_true(#files(dir) > 0, "block files written")
            local hit_before = m:stats().hit_tokens
            assert.are.same(first, m:generate(prompt(1), greedy))
            t = m:stats().tiers
            assert.is_true(t.disk.hits > 0 and t.disk.restore_bytes > 0, "disk hits")
            assert.is_true(m:stats().hit_tokens - hit_before >= 96, "the restored prefix counts as cached")
        end)
    end)

    describe(":set_spill_policy()", function()
        it("drops nodes below min_tokens instead of spilling them", function()
            local m = open { kv_mem = SMALL, kv_host_mem = 4 * 1048576 }
            m:set_spill_policy { min_tokens = 100000, min_hits = 0 }
            fill_and_evict(m)
            assert.is_true(m:stats().evictions > 0)
            assert.are.equal(0, m:stats().tiers.host.spills)
            m:set_spill_policy {}
            for k = 20, 30 do
                assert(m:generate(prompt(k), greedy))
            end
            assert.is_true(m:stats().tiers.host.spills > 0, "{} spills everything again")
        end)

        it("rejects what is not a table of non-negative integers", function()
            local m = open { kv_mem = SMALL }
            assert.has_error(function() m:set_spill_policy(3) end,
                "bad argument 'policy' to set_spill_policy (expected a table, got number)")
            assert.has_error(function() m:set_spill_policy { tokens = 1 } end,
                "bad argument 'opts' to set_spill_policy (unknown option \"tokens\")")
            assert.has_error(function() m:set_spill_policy { min_tokens = -1 } end,
                "bad argument 'min_tokens' to set_spill_policy (expected an integer >= 0, got -1)")
            assert.has_error(function() m:set_spill_policy { min_hits = 0.5 } end,
                "bad argument 'min_hits' to set_spill_policy (expected an integer >= 0, got 0.5)")
            m:set_spill_policy { min_tokens = 1, min_hits = 2 } -- without tiers: accepted, kept for nothing
        end)
    end)

    describe(":save_cache() and :load_cache()", function()
        it("write the cache for a restart, which serves it from disk with the same tokens", function()
            local dir = tmpdir()
            local m = open { kv_dir = dir }
            local want = assert(m:generate(prompt(1), greedy))
            local n = m:save_cache()
            assert.is_true(n >= 6, "blocks written: " .. tostring(n))
            assert.are.equal(n, #files(dir))
            assert.are.equal(0, m:save_cache(), "files already there are kept")
            m:close()

            local m2 = open { kv_dir = dir }
            local rep = m2:load_cache()
            assert.are.same({ files = n, loaded = n, refused = 0, why = {} }, rep)
            assert.are.same(want, m2:generate(prompt(1), greedy))
            local t = m2:stats().tiers
            assert.is_true(t.disk.hits >= 6, "disk hits: " .. t.disk.hits)
            assert.is_true(t.restored_tokens >= 96)
        end)

        it("refuse a corrupted file, naming it, and still load the rest", function()
            local dir = tmpdir()
            local m = open { kv_dir = dir }
            local want = assert(m:generate(prompt(1), greedy))
            local n = m:save_cache()
            m:close()
            local names = files(dir)
            local f = assert(io.open(dir .. "/" .. names[1], "r+b"))
            local size = f:seek("end")
            f:seek("set", math.floor(size / 2))
            local b = f:read(1)
            f:seek("set", math.floor(size / 2))
            f:write(string.char((b:byte() + 1) % 256))
            f:close()

            local m2 = open { kv_dir = dir }
            local rep = m2:load_cache()
            assert.are.equal(n, rep.files)
            assert.are.equal(n - 1, rep.loaded)
            assert.are.equal(1, rep.refused)
            assert.are.equal(1, #rep.why)
            assert.truthy(rep.why[1]:find(names[1], 1, true), rep.why[1])
            assert.are.same(want, m2:generate(prompt(1), greedy), "the answer does not change")
        end)

        it("adopt a directory on a model opened without one", function()
            local dir = tmpdir()
            local m = open {}
            assert(m:generate(prompt(1), greedy))
            local n = m:save_cache(dir)
            assert.is_true(n > 0)
            assert.are.equal(dir, m.kv_dir)
            local m2 = open {}
            local rep = m2:load_cache(dir)
            assert.are.equal(n, rep.loaded)
            assert.are.equal(dir, m2.kv_dir)
        end)

        it("raise without a directory, with another one and with a bad argument", function()
            local m = open {}
            assert.has_error(function() m:save_cache() end, "save_cache: no directory: pass one or set kv_dir")
            assert.has_error(function() m:load_cache() end, "load_cache: no directory: pass one or set kv_dir")
            assert.has_error(function() m:save_cache(3) end,
                "bad argument 'dir' to save_cache (expected a directory path (a non-empty string) or nil, got 3)")
            assert.has_error(function() m:load_cache("") end,
                "bad argument 'dir' to load_cache (expected a directory path (a non-empty string) or nil, got \"\")")
            local dir = tmpdir()
            local m2 = open { kv_dir = dir }
            assert.has_error(function() m2:save_cache(dir .. "-other") end)
        end)

        it("raise on a closed model", function()
            local m = tl.Model(path)
            m:close()
            for _, name in ipairs { "save_cache", "load_cache", "set_spill_policy" } do
                assert.has_error(function() m[name](m, {}) end, "tinyloop.Model is closed; cannot call " .. name)
            end
        end)
    end)
end)
