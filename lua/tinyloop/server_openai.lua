-- tinyloop.server_openai - the OpenAI request and response shapes: body
-- validation (400s that name the field), errors in the OpenAI error shape,
-- completion / chat objects, SSE chunks and usage with cached tokens.
-- luacheck: globals ngx
local cjson = require "cjson.safe"
local SAMPLING = require("tinyloop.args").SAMPLING

local type, tostring, floor, format = type, tostring, math.floor, string.format
local ngx_time = ngx.time

local _M = {}

local json_encode = cjson.encode
-- Request bodies go through an instance of their own that refuses NaN,
-- Infinity and hex numbers (cjson accepts them by default); other users
-- of cjson keep its defaults.
local decoder = cjson.new()
decoder.decode_invalid_numbers(false)
local INT_MAX = 2 ^ 31 - 1


-- ---- errors ----------------------------------------------------------------------------

local ERR_TYPES = {
    [400] = "invalid_request_error", [401] = "invalid_request_error", [404] = "invalid_request_error",
    [405] = "invalid_request_error", [413] = "invalid_request_error", [429] = "rate_limit_error",
    [500] = "server_error", [503] = "server_error", [504] = "server_error",
}


function _M.error_body(status, message, param, code)
    return json_encode({ error = {
        message = message, type = ERR_TYPES[status] or "invalid_request_error",
        param = param or cjson.null, code = code or cjson.null,
    } })
end


-- Sends an error and ends the request (content phase).
function _M.send_error(status, message, param, code, headers)
    ngx.status = status
    ngx.header["Content-Type"] = "application/json"
    if headers then
        for k, v in pairs(headers) do
            ngx.header[k] = v
        end
    end
    ngx.say(_M.error_body(status, message, param, code))
    return ngx.exit(status)
end


-- ---- validation -----------------------------------------------------------------------

local function is_int(v)
    return type(v) == "number" and v == floor(v) and v > -2 ^ 53 and v < 2 ^ 53
end


-- A number that is neither NaN nor infinite (1e999 decodes to inf).
local function is_finite(v)
    return type(v) == "number" and v == v and v > -math.huge and v < math.huge
end


local function given(v)
    return v ~= nil and v ~= cjson.null
end


local function bad(field, what)
    return nil, format("Invalid value for '%s': %s", field, what), field
end


-- Common sampling fields -> a table of options, or nil, message, field.
local function sampling(body, o, max_default)
    local v = body.max_tokens
    if v == nil then
        v = body.max_completion_tokens
    end
    if v ~= nil and v ~= cjson.null then
        if not is_int(v) or v < 1 or v > INT_MAX then
            return bad("max_tokens", "expected an integer in [1, 2147483647], got " .. tostring(v))
        end
        o.max_tokens = v
    else
        o.max_tokens = max_default
        o.max_tokens_default = true
    end
    v = body.temperature
    if v ~= nil and v ~= cjson.null then
        if not is_finite(v) or v < 0 or v > 2 then
            return bad("temperature", "expected a number in [0, 2], got " .. tostring(v))
        end
        o.temperature = v
    else
        o.temperature = SAMPLING.temperature
    end
    v = body.top_p
    if v ~= nil and v ~= cjson.null then
        if not is_finite(v) or v <= 0 or v > 1 then
            return bad("top_p", "expected a number in (0, 1], got " .. tostring(v))
        end
        o.top_p = v
    else
        o.top_p = SAMPLING.top_p
    end
    v = body.top_k
    if v ~= nil and v ~= cjson.null then
        if not is_int(v) or v < 0 or v > INT_MAX then
            return bad("top_k", "expected an integer in [0, 2147483647], got " .. tostring(v))
        end
        o.top_k = v
    else
        o.top_k = o.temperature > 0 and SAMPLING.top_k or 0 -- greedy ignores it
    end
    v = body.seed
    if v ~= nil and v ~= cjson.null then
        if not is_int(v) then
            return bad("seed", "expected an integer, got " .. tostring(v))
        end
        o.seed = v < 0 and -v or v
    end
    v = body.stop
    if v ~= nil and v ~= cjson.null then
        if type(v) == "string" then
            o.stop = { v }
        elseif type(v) == "table" and #v <= 4 then
            for i = 1, #v do
                if type(v[i]) ~= "string" or v[i] == "" then
                    return bad("stop", "expected up to 4 non-empty strings")
                end
            end
            o.stop = v
        else
            return bad("stop", "expected a string or an array of up to 4 strings")
        end
        if o.stop[1] == "" then
            return bad("stop", "expected non-empty strings")
        end
    end
    v = body.stream
    if v ~= nil and v ~= cjson.null then
        if type(v) ~= "boolean" then
            return bad("stream", "expected a boolean, got " .. tostring(v))
        end
        o.stream = v
    end
    v = body.stream_options
    if given(v) then
        if type(v) ~= "table" or (given(v.include_usage) and type(v.include_usage) ~= "boolean") then
            return bad("stream_options", "expected { include_usage = boolean }")
        end
        o.include_usage = v.include_usage == true
    end
    v = body.user
    if v ~= nil and v ~= cjson.null and type(v) ~= "string" then
        return bad("user", "expected a string")
    end
    o.user = v
    v = body.n
    if v ~= nil and v ~= cjson.null and v ~= 1 then
        return bad("n", "only n = 1 is supported, got " .. tostring(v))
    end
    v = body.model
    if v ~= nil and v ~= cjson.null and type(v) ~= "string" then
        return bad("model", "expected a string")
    end
    o.model = v
    return o
end


-- Fields a request may carry. true: supported. A function: accepted
-- only with the value it approves (OpenAI's default, a no-op here); any
-- other value is refused naming the field rather than silently ignored.
local function is_false(v) return v == false end
local function is_zero(v) return v == 0 end
local function is_empty(v) return type(v) == "table" and next(v) == nil end
local COMMON = {
    model = true, max_tokens = true, max_completion_tokens = true, temperature = true, top_p = true,
    top_k = true, seed = true, stop = true, stream = true, stream_options = true, user = true, n = true,
    presence_penalty = is_zero, frequency_penalty = is_zero, logit_bias = is_empty,
}
local FIELDS = {
    completion = setmetatable({ prompt = true, echo = is_false, suffix = function() return false end,
        best_of = function(v) return v == 1 end, logprobs = function() return false end }, { __index = COMMON }),
    chat = setmetatable({ messages = true, logprobs = is_false, top_logprobs = function() return false end,
        tools = is_empty, tool_choice = function(v) return v == "none" end,
        parallel_tool_calls = function(v) return type(v) == "boolean" end,
        response_format = function(v) return type(v) == "table" and v.type == "text" end,
    }, { __index = COMMON }),
}


-- Unknown and unsupported fields -> nil, message, field.
local function check_fields(body, kind)
    local known = FIELDS[kind]
    for k, v in pairs(body) do
        local rule = type(k) == "string" and known[k]
        if not rule then
            return nil, format("Unrecognized request argument supplied: %s", tostring(k)), tostring(k)
        end
        if rule ~= true and given(v) and not rule(v) then
            return nil, format("Unsupported value for '%s': this server does not implement it (got %s).", k,
                type(v) == "table" and "an object" or tostring(v)), k
        end
    end
    return true
end
_M.check_fields = check_fields


-- decode(raw) -> body table | nil, message
function _M.decode(raw)
    if raw == nil or raw == "" then
        return nil, "We could not parse the JSON body of your request: the body is empty."
    end
    local body, err = decoder.decode(raw)
    if body == nil then
        return nil, "We could not parse the JSON body of your request: " .. tostring(err)
    end
    if type(body) ~= "table" then
        return nil, "We could not parse the JSON body of your request: expected a JSON object."
    end
    return body
end


-- completion_request(body) -> opts | nil, message, field. opts.prompt is
-- a string or opts.prompt_ids a table of token ids.
function _M.completion_request(body)
    local o = {}
    local fok, ferr, ffield = check_fields(body, "completion")
    if not fok then
        return nil, ferr, ffield
    end
    local p = body.prompt
    if p == nil or p == cjson.null then
        return nil, "Missing required parameter: 'prompt'.", "prompt"
    end
    if type(p) == "string" then
        o.prompt = p
    elseif type(p) == "table" and #p >= 1 then
        if type(p[1]) == "string" then
            if #p ~= 1 then
                return bad("prompt", "only one prompt per request is supported")
            end
            o.prompt = p[1]
        else
            for i = 1, #p do
                if not is_int(p[i]) or p[i] < 0 then
                    return bad("prompt", "expected a string or an array of token ids")
                end
            end
            o.prompt_ids = p
        end
    else
        return bad("prompt", "expected a string or an array of token ids")
    end
    if o.prompt == "" then
        return bad("prompt", "the prompt is empty")
    end
    return sampling(body, o, 16)
end


local ROLES = { system = true, user = true, assistant = true, developer = true }
-- name (a participant's name) is accepted and not rendered; tool calls are not supported
local MESSAGE_FIELDS = { role = true, content = true, name = true }


-- chat_request(body) -> opts | nil, message, field. opts.messages is a list of
-- { role, content } with string contents.
function _M.chat_request(body)
    local o = {}
    local fok, ferr, ffield = check_fields(body, "chat")
    if not fok then
        return nil, ferr, ffield
    end
    local m = body.messages
    if m == nil or m == cjson.null then
        return nil, "Missing required parameter: 'messages'.", "messages"
    end
    if type(m) ~= "table" or #m == 0 then
        return bad("messages", "expected a non-empty array of messages")
    end
    local msgs = {}
    for i = 1, #m do
        local e = m[i]
        local field = format("messages[%d]", i - 1)
        if type(e) ~= "table" then
            return bad(field, "expected an object")
        end
        for k, v in pairs(e) do
            if not MESSAGE_FIELDS[k] or (k == "name" and type(v) ~= "string") then
                return nil, format("Unrecognized or unsupported message field '%s.%s'.", field, tostring(k)),
                    field .. "." .. tostring(k)
            end
        end
        if type(e.role) ~= "string" or not ROLES[e.role] then
            return bad(field .. ".role", "expected one of system, user, assistant")
        end
        local c = e.content
        if type(c) == "table" then
            -- content parts: concatenate the text parts
            local parts = {}
            for j = 1, #c do
                if type(c[j]) ~= "table" or c[j].type ~= "text" or type(c[j].text) ~= "string" then
                    return bad(field .. ".content", "only text content parts are supported")
                end
                parts[#parts + 1] = c[j].text
            end
            c = table.concat(parts)
        end
        if type(c) ~= "string" then
            return bad(field .. ".content", "expected a string")
        end
        local nul = c:find("\0", 1, true)
        if nul then
            -- C strings would end there and silently drop the rest
            return bad(field .. ".content", format("contains a NUL byte (at byte %d)", nul - 1))
        end
        msgs[i] = { role = e.role == "developer" and "system" or e.role, content = c }
    end
    o.messages = msgs
    return sampling(body, o, nil)
end


-- ---- responses ----------------------------------------------------------------------------

local FINISH = { [1] = "stop", [2] = "length", [3] = "stop", [4] = "stop" }
_M.FINISH = FINISH


function _M.usage(r)
    return {
        prompt_tokens = r.n_prompt, completion_tokens = r.n_completion,
        total_tokens = r.n_prompt + r.n_completion,
        prompt_tokens_details = { cached_tokens = r.n_cached },
    }
end


function _M.completion(r)
    return json_encode({
        id = r.rid, object = "text_completion", created = r.created or ngx_time(), model = r.model,
        choices = { { index = 0, text = r.text, logprobs = cjson.null, finish_reason = r.finish } },
        usage = _M.usage(r),
    })
end


function _M.chat(r)
    return json_encode({
        id = r.rid, object = "chat.completion", created = r.created or ngx_time(), model = r.model,
        choices = { { index = 0, message = { role = "assistant", content = r.text },
            logprobs = cjson.null, finish_reason = r.finish } },
        usage = _M.usage(r),
    })
end


-- SSE chunk: text delta (finish nil) or the last chunk (finish set).
function _M.chunk(r, chat, text, finish, first)
    local obj
    if chat then
        local delta = {}
        if first then
            delta.role = "assistant"
        end
        if text then
            delta.content = text
        end
        obj = { id = r.rid, object = "chat.completion.chunk", created = r.created, model = r.model,
            choices = { { index = 0, delta = delta, logprobs = cjson.null,
                finish_reason = finish or cjson.null } } }
    else
        obj = { id = r.rid, object = "text_completion", created = r.created, model = r.model,
            choices = { { index = 0, text = text or "", logprobs = cjson.null,
                finish_reason = finish or cjson.null } } }
    end
    if finish and r.usage_in_stream then
        obj.usage = _M.usage(r)
    end
    return "data: " .. json_encode(obj) .. "\n\n"
end


return _M
