-- The Lua sources are luacheck clean (.luacheckrc: LuaJIT std, busted in specs).
local helpers = require "helpers"

describe("luacheck", function()
    it("reports no warnings for lua/, bindings/, tests/spec/ and examples/", function()
        local _, has = helpers.run("command -v luacheck")
        if not has then
            pending("SKIP: luacheck (Debian package lua-check) not installed")
            return
        end
        local out, ok = helpers.run("cd '" .. helpers.root .. "' && luacheck --no-color -q lua bindings tests/spec examples")
        assert.is_true(ok, out)
    end)
end)


-- lua/README.md: runtime failures are told apart by their code
-- (C.TL_ERR_*, tl_last_error_code()) or by data (model:kv_blocks), never
-- by the text of the message. This finds a :find/:match/:gmatch/:gsub (or
-- string.find(x, ...)) whose subject is named like an error message (err,
-- rerr, r.error, msg, message, reason); other parsing (headers, paths, JSON)
-- is not flagged. A line that reads a message that is not an engine error
-- (the Lua compiler's, say) says so with "-- not an engine error: <why>".
describe("error classification", function()
    local ERRISH = { "err", "msg", "message", "reason" }
    local PATTERN_FNS = { find = true, match = true, gmatch = true, gsub = true }

    local function errish(name)
        local last = name:match("([%w_]+)$") or name
        last = last:lower()
        for _, w in ipairs(ERRISH) do
            if last:find(w, 1, true) then
                return true
            end
        end
        return false
    end

    -- The subjects of pattern calls on one line of code (comments dropped).
    local function suspects(line)
        local code = line:gsub("%-%-.*$", "")
        local found = {}
        for subj, fn in code:gmatch("([%w_%.]+)%s*:%s*([%w_]+)%s*%(") do
            if PATTERN_FNS[fn] then
                found[#found + 1] = subj
            end
        end
        for fn, subj in code:gmatch("([%w_]+)%s*%(%s*([%w_%.]+)%s*,") do
            if PATTERN_FNS[fn] then
                found[#found + 1] = subj
            end
        end
        local out = {}
        for _, s in ipairs(found) do
            if errish(s) then
                out[#out + 1] = s
            end
        end
        return out
    end

    local function scan(path)
        local bad = {}
        local n = 0
        for line in io.lines(path) do
            n = n + 1
            if not line:find("-- not an engine error:", 1, true) then
                for _, s in ipairs(suspects(line)) do
                    bad[#bad + 1] = string.format("%s:%d: %s reads a message: %s", path, n, s, line)
                end
            end
        end
        return bad
    end

    it("flags a message-text test and leaves ordinary parsing alone", function()
        assert.same({ "r.error" }, suspects([[if r.error:find("nothing else running", 1, true) then]]))
        assert.same({ "err" }, suspects([[local m = err:match("^out of memory")]]))
        assert.same({ "msg" }, suspects([[ngx.log(msg:find("rejected", 1, true) and WARN or NOTICE, msg)]]))
        assert.same({ "rerr" }, suspects([[if string.find(rerr, "timeout") then]]))
        assert.same({ "lib.last_error_message" }, suspects([[lib.last_error_message:gsub("x", "")]]))
        assert.same({}, suspects([[return h:match("^%s*[Bb]earer%s+(%S+)")]]))
        assert.same({}, suspects([[local fam = k:match("^([%w_]+)")]]))
        assert.same({}, suspects([[if m.content:find("\0", 1, true) then]]))
        assert.same({}, suspects([[local n = text:find(s, 1, true) -- err:find(x) in a comment]]))
        assert.same({}, suspects([[elseif rerr == "timeout" then]]))
    end)

    it("finds no runtime failure told apart by its message in lua/tinyloop", function()
        local files = {}
        local p = io.popen("cd '" .. helpers.root .. "' && find lua/tinyloop -name '*.lua' | sort")
        for f in p:lines() do
            files[#files + 1] = f
        end
        p:close()
        assert.is_true(#files > 10)
        local bad = {}
        for _, f in ipairs(files) do
            for _, b in ipairs(scan(helpers.root .. "/" .. f)) do
                bad[#bad + 1] = b
            end
        end
        assert.same({}, bad)
    end)
end)


-- The contract the Lua API mirrors is docs/prefix-pool.md; comments name
-- it, not "the seed" (the sampling option `seed` is another thing).
describe("references to the contract", function()
    it("say docs/prefix-pool.md, not \"the seed\", in lua/tinyloop", function()
        local bad = {}
        local p = io.popen("cd '" .. helpers.root .. "' && grep -rniE \"the seed([^a-z_=(]|$)|seed's\" lua/tinyloop")
        for line in p:lines() do
            bad[#bad + 1] = line
        end
        p:close()
        assert.same({}, bad)
    end)
end)
