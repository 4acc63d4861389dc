package plans

// StrictAreaCodes is the area-code table, for the test that checks it
// against phonenumbers' data.
var StrictAreaCodes = strictAreaCodes
