-- Functions called per token or per event-loop tick allocate no cdata per
-- call (STYLE.md: scratch cdata once per module); the server's engine
-- wrapper takes its status codes from the generated enum (issue 16).
local helpers = require "helpers"

-- The source of the function defined by the line `header` (up to the
-- next line that is `end` at column 0) in lua/tinyloop/<file>.
local function body(file, header)
    local lines, on = {}, false
    for line in io.lines(helpers.root .. "/lua/tinyloop/" .. file) do
        if not on and line:find(header, 1, true) == 1 then
            on = true
        end
        if on then
            lines[#lines + 1] = line
            if line == "end" then
                break
            end
        end
    end
    assert(on, file .. ": no " .. header)
    return table.concat(lines, "\n")
end

local HOT = {
    { "init.lua", "local function stream_next(" },
    { "init.lua", "local function text_next(" },
    { "init.lua", "function Model:request_state(" },
    -- (Model:piece grows its model's scratch when a piece is longer than
    -- any before: once, not per call, so it is not listed.)
    { "server_engine.lua", "function _M._notifier(" },
    { "server_engine.lua", "function _M:wake(" },
    { "server_engine.lua", "function _M:take(" },
    { "server_engine.lua", "function _M:submit(" },
    { "server_engine.lua", "function _M:cancel(" },
    { "server_engine.lua", "function _M:release(" },
    { "server.lua", "local function run(" },
    { "server.lua", "local function fill_params(" },
}

describe("hot paths", function()
    for _, h in ipairs(HOT) do
        it(h[1] .. " " .. h[2] .. "...) allocates no cdata per call", function()
            local src = body(h[1], h[2]):gsub("%-%-[^\n]*", "")
            for _, alloc in ipairs { "ffi_new(", "ffi.new(", "ffi_cast(", "ffi.cast(", "ffi.typeof(" } do
                assert.is_nil(src:find(alloc, 1, true), h[2] .. " calls " .. alloc)
            end
        end)
    end
end)


describe("tinyloop.server_engine", function()
    local saved_ngx

    before_each(function()
        saved_ngx = rawget(_G, "ngx")
        _G.ngx = { log = function() end, ERR = 4, WARN = 5, INFO = 7 }
        package.preload["ngx.semaphore"] = function() return {} end
        package.loaded["tinyloop.server_engine"] = nil
    end)

    after_each(function()
        _G.ngx = saved_ngx
        package.preload["ngx.semaphore"] = nil
        package.loaded["ngx.semaphore"] = nil
        package.loaded["tinyloop.server_engine"] = nil
    end)

    it("exports every status code of the generated enum, with its value", function()
        local eng = require "tinyloop.server_engine"
        local lib = require "tinyloop.lib"
        local n = 0
        for name, v in pairs(lib.status) do
            assert.are.equal(v, eng[name], name)
            n = n + 1
        end
        assert.is_true(n >= 10)
        assert.are.equal(tonumber(lib.C.TL_ERR_NOMEM), eng.ERR_NOMEM)
    end)
end)
